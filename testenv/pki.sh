#!/usr/bin/env bash
# A throwaway certificate authority for one test environment, made with
# openssl, for the secured listeners of kafka.sh and the ssl = on of pg.sh.
#
#   pki.sh make    DIR   create DIR/pki once (idempotent), print its env
#   pki.sh env     DIR   print DIR/pki/pki.env
#   pki.sh destroy DIR   remove DIR/pki
#
# DIR/pki holds (PEM, keys PKCS#8 unencrypted, P-256):
#   ca.pem             the environment's CA (valid 10 years; it lives as long
#                      as DIR does)
#   server.pem/.key    signed by it, for IP 127.0.0.1 and DNS localhost
#                      (serverAuth): the broker's and PostgreSQL's certificate
#   client.pem/.key    signed by it, CN outboxd (clientAuth): for mTLS to the
#                      broker and certificate authentication to PostgreSQL
#   other-ca.pem       an unrelated CA that signed nothing here: "a wrong CA"
# DIR/pki/pki.env gets TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE (the client's),
# TLS_SERVER_CERT_FILE, TLS_SERVER_KEY_FILE and TLS_OTHER_CA_FILE.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"

usage() {
  sed -n '2,18p' "$0" >&2
  exit 2
}

command -v openssl >/dev/null 2>&1 || die "openssl not found (Debian: apt-get install openssl)"

# new_key FILE: a P-256 private key in PKCS#8, as Kafka's PEM keystore
# requires.
new_key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
  chmod 0600 "$1"
}

# new_ca NAME CN
new_ca() {
  new_key "$T/$1.key"
  openssl req -x509 -new -key "$T/$1.key" -sha256 -days 3650 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$T/$1.pem" 2>/dev/null
}

# issue NAME CN EXTENSIONS: NAME.pem and NAME.key, signed by the CA.
issue() {
  new_key "$T/$1.key"
  openssl req -new -key "$T/$1.key" -subj "/CN=$2" -out "$T/$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$T/$1.ext"
  openssl x509 -req -in "$T/$1.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$T/$1.ext" -out "$T/$1.pem" 2>/dev/null
  rm -f "$T/$1.csr" "$T/$1.ext"
}

write_env() {
  cat >"$P/pki.env" <<EOF
TLS_CA_FILE=$P/ca.pem
TLS_CERT_FILE=$P/client.pem
TLS_KEY_FILE=$P/client.key
TLS_SERVER_CERT_FILE=$P/server.pem
TLS_SERVER_KEY_FILE=$P/server.key
TLS_OTHER_CA_FILE=$P/other-ca.pem
EOF
}

cmd_make() {
  if [[ -f "$P/pki.env" ]]; then cat "$P/pki.env"; return; fi
  # Made in a temporary folder and moved in whole, so a half-made PKI is
  # never taken for one.
  T="$(mktemp -d "$DIR/.pki.XXXXXX")"
  trap 'rm -rf "$T"' EXIT
  new_ca ca "outboxd test CA $(basename "$DIR")"
  issue server localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
  issue client outboxd "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
  new_ca other-ca "outboxd unrelated CA"
  rm -f "$T/other-ca.key" "$T/ca.srl"
  chmod 0755 "$T"
  chmod 0644 "$T"/*.pem
  rm -rf "$P"
  mv "$T" "$P"
  trap - EXIT
  write_env
  cat "$P/pki.env"
}

[[ $# -ge 2 ]] || usage
cmd="$1"
DIR="$(abs_dir "$2")"
P="$DIR/pki"
exec 9>"$DIR/.pki.lock"
flock 9
case "$cmd" in
  make) cmd_make ;;
  env) [[ -f "$P/pki.env" ]] && cat "$P/pki.env" || die "no $P/pki.env" ;;
  destroy) rm -rf "$P" "$DIR"/.pki.* ;;
  *) usage ;;
esac
