package config_test

import (
	"io/fs"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

func TestRedactedDSN(t *testing.T) {
	tests := []struct {
		dsn, want string
	}{
		{"postgres://outboxd:s3cr3t@127.0.0.1:5432/km0_comandes", "postgres://outboxd:xxxxx@127.0.0.1:5432/km0_comandes"},
		{"postgresql://outboxd:s3cr3t@db/km0?sslmode=require", "postgresql://outboxd:xxxxx@db/km0?sslmode=require"},
		{"postgres://outboxd:p%40ss%2Fw0rd@db/km0", "postgres://outboxd:xxxxx@db/km0"},
		{"postgres://outboxd@db/km0", "postgres://outboxd@db/km0"},
		{"postgres://outboxd@db/km0?password=s3cr3t&sslmode=disable", "postgres://outboxd@db/km0?password=xxxxx&sslmode=disable"},
		{"postgres://outboxd:s3/cr3t@db/km0", "postgres://xxxxx@db/km0"}, // a / in the password: all up to the last @ goes
		{"host=db user=outboxd password=s3cr3t dbname=km0", "host=db user=outboxd password=xxxxx dbname=km0"},
		{"password=s3cr3t host=db", "password=xxxxx host=db"},
		{"host=db password = s3cr3t", "host=db password = xxxxx"},
		{`host=db password='s3 cr\'3t' dbname=km0`, "host=db password=xxxxx dbname=km0"},
		{`host=db password=s3\ cr3t dbname=km0`, "host=db password=xxxxx dbname=km0"},
		{"host=db user=outboxd dbname=km0", "host=db user=outboxd dbname=km0"},
		{"", ""},
		// libpq reads the user info to the first @ before the first /,
		// Go's url.Parse (pgconn's) to the first ? or # before it: a
		// password may be on either side, all goes (issue 35, item 3).
		{"postgres://outboxd:12?s3cr3t@db/km0", "postgres://xxxxx"},
		{"postgres://outboxd:12#s3cr3t@db/km0", "postgres://xxxxx"},
		{"postgres://db?user=u&password=s3cr3t@ss", "postgres://xxxxx"},
		{"postgres://db/km0?user=u&password=p@s3cr3t", "postgres://db/km0?user=u&password=xxxxx"},
		// An @ after the host: which part is the password is in doubt.
		{"postgres://outboxd:p@s3cr3t@db/km0", "postgres://xxxxx@db/km0"},
		{"postgres://u:99/Zq9s3cr3t@db/km0", "postgres://xxxxx@db/km0"},
		// Unparseable without user info: only the scheme is certain.
		{"postgres://db:s3cr3t/km0", "postgres://xxxxx"},
		{"postgres://outboxd@db/km0?sslpassword=k3y&sslmode=require", "postgres://outboxd@db/km0?sslpassword=xxxxx&sslmode=require"},
		{"postgres://outboxd@db/km0?pass%77ord=s3cr3t", "postgres://outboxd@db/km0?pass%77ord=xxxxx"},
		{"postgres://outboxd@db/km0?password=s3cr3t#frag", "postgres://outboxd@db/km0?password=xxxxx"}, // # is part of the value for libpq
		{"host=db sslpassword=k3y sslmode=require", "host=db sslpassword=xxxxx sslmode=require"},
		{"host=db password=s3\\\ncr3t dbname=km0", "host=db password=xxxxx dbname=km0"},
		// A keyword=value DSN that does not parse: nothing is certain.
		{"host=db password=s3 cr3t", "xxxxx"},
		{"host=db password='s3cr3t", "xxxxx"},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			got := config.Postgres{DSN: tt.dsn}.RedactedDSN()
			if got != tt.want {
				t.Errorf("RedactedDSN(%q) = %q, want %q", tt.dsn, got, tt.want)
			}
			for _, secret := range []string{"s3cr3t", "cr3t", "p%40ss", "k3y"} {
				if strings.Contains(got, secret) {
					t.Errorf("RedactedDSN(%q) = %q leaks %q", tt.dsn, got, secret)
				}
			}
		})
	}
}

// passwords holds characters that mean something in a URL, in a
// keyword=value string, in YAML or to ${NAME} expansion.
var passwords = []string{
	`p@ss/w"rd`, `a b'c\d`, `%41`, `ünï`, `x#y?z`,
	`'`, `\`, `a\`, ` lead and trail `, "tab\there", `}{$$`, `${X}`, `&=+;:,`, `-._~`, `123`, `null`,
}

// fileReader reads from a map, as Parse's readFile.
func fileReader(files map[string]string) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		data, ok := files[name]
		if !ok {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		return []byte(data), nil
	}
}

// Every way of giving a password yields it byte for byte, and leaves the
// rest of the DSN as it was written.
func TestPasswordsWithAnyCharacter(t *testing.T) {
	const (
		url = "postgres://outboxd@db.internal:5432/km0?sslmode=disable"
		kv  = "host=db.internal port=5432 dbname=km0 user=outboxd sslmode=disable"
	)
	ways := []struct {
		name     string
		postgres string // the postgres keys besides slot and publication; PW is the password
		files    map[string]string
		prefix   string // the password the connection gets is prefix + PW
	}{
		{name: "${PW} in URL user info", postgres: `dsn: "postgres://outboxd:${PW}@db.internal:5432/km0?sslmode=disable"`},
		{name: "${PW} in URL query", postgres: `dsn: "postgres://outboxd@db.internal:5432/km0?sslmode=disable&password=${PW}"`},
		{name: "${PW} after text in URL user info", postgres: `dsn: "postgres://outboxd:pre${PW}@db.internal:5432/km0"`, prefix: "pre"},
		{name: "${PW} in key=value", postgres: `dsn: "host=db.internal port=5432 dbname=km0 user=outboxd password=${PW} sslmode=disable"`},
		{name: "${PW} quoted in key=value", postgres: `dsn: "host=db.internal port=5432 dbname=km0 user=outboxd password='${PW}' sslmode=disable"`},
		{name: "${PW} after text in key=value", postgres: `dsn: "host=db.internal port=5432 password=pre${PW} dbname=km0 user=outboxd"`, prefix: "pre"},
		{name: "${PW} as the first key=value", postgres: `dsn: "password=${PW} host=db.internal port=5432 dbname=km0 user=outboxd"`},
		{name: "postgres.password ${PW} over a URL password", postgres: `dsn: "postgres://outboxd:old@db.internal:5432/km0"` + "\n  password: \"${PW}\""},
		{name: "postgres.password unquoted ${PW}", postgres: `dsn: "` + kv + `"` + "\n  password: ${PW}"},
		{name: "postgres.password_file over a key=value password", postgres: `dsn: "` + kv + ` password=old"` + "\n  password_file: /run/secrets/pg",
			files: map[string]string{"/run/secrets/pg": "${PW}\n"}},
		{name: "postgres.password_file without newline", postgres: `dsn: "` + url + `"` + "\n  password_file: /run/secrets/pg",
			files: map[string]string{"/run/secrets/pg": "${PW}"}},
	}
	for _, w := range ways {
		for _, pw := range passwords {
			t.Run(w.name+"/"+pw, func(t *testing.T) {
				yml := strings.Replace(minimal, `  dsn: "postgres://outboxd@127.0.0.1/km0"`, "  "+w.postgres, 1)
				files := map[string]string{}
				for name, content := range w.files {
					files[name] = strings.ReplaceAll(content, "${PW}", pw)
				}
				cfg, err := config.Parse([]byte(yml), env(map[string]string{"PW": pw}), fileReader(files))
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				cc, err := cfg.Postgres.ConnConfig()
				if err != nil {
					t.Fatalf("ConnConfig: %v", err)
				}
				if want := w.prefix + pw; cc.Password != want {
					t.Errorf("password = %q, want %q (DSN %q)", cc.Password, want, cfg.Postgres.DSN)
				}
				if cc.Host != "db.internal" || cc.Port != 5432 || cc.Database != "km0" || cc.User != "outboxd" {
					t.Errorf("host %q port %d database %q user %q; want db.internal 5432 km0 outboxd (DSN %q)",
						cc.Host, cc.Port, cc.Database, cc.User, cfg.Postgres.DSN)
				}
				assertNoFragment(t, "RedactedDSN", cfg.Postgres.RedactedDSN(), pw)
			})
		}
	}
}

// A DSN pgconn cannot parse is a config error with its line; neither that
// error nor ConnConfig's holds the password or the text pgconn choked on
// (qu1rk here), and RedactedDSN does not hold the password.
func TestBadDSN(t *testing.T) {
	const (
		password = "s3cr3t-p@ss/w0rd"
		choked   = "qu1rk"
	)
	tests := []struct {
		dsn    string
		reason string
	}{
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db:99999/km0", "invalid port"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db:qu1rk/km0", "invalid port"},
		{"postgres://outboxd:s3cr3t-p%qu1rk@db/km0", "not a valid URL (percent-encode characters such as @ / % and spaces in the user name and password, or set postgres.password)"},
		{"postgres://outboxd:s3cr3t-p@ss/w0rd%qu1rk@db/km0", "an @ after the host: a user name or password holding / or @ must be percent-encoded (/ as %2F, @ as %40), or give the password as postgres.password or postgres.password_file"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db/km0?application_name=a qu1rk", "not a valid URL"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db:qu1rk:1/km0", "invalid port"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db/km0?connect_timeout=qu1rk", "invalid connect_timeout"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db/km0?sslmode=qu1rk", "sslmode is invalid"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db/km0?target_session_attrs=qu1rk", "unknown target_session_attrs value"},
		{"postgres://outboxd:s3cr3t-p%40ss%2Fw0rd@db/km0?sslmode=verify-full&sslrootcert=/nonexistent/qu1rk.crt", "a TLS file it names (sslrootcert, sslcert, sslkey) does not exist"},
		{"host=db password='s3cr3t-p@ss/w0rd", "unterminated quoted string in connection info string"},
		{"host=db password=s3cr3t-p@ss /w0rd qu1rk=x", "not a valid keyword=value string"},
		{"host=db password=s3cr3t-p@ss /w0rd", "invalid keyword/value"},
		{"host=db port=qu1rk password=s3cr3t-p@ss/w0rd", "invalid port"},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			pg := config.Postgres{DSN: tt.dsn}
			_, err := pg.ConnConfig()
			if err == nil || !strings.HasPrefix(err.Error(), "postgres.dsn is not a valid connection string: "+tt.reason) {
				t.Errorf("ConnConfig error = %v, want one with reason %q", err, tt.reason)
			} else {
				assertNoFragment(t, "ConnConfig error", err.Error(), password)
				assertNoFragment(t, "ConnConfig error", err.Error(), choked)
			}
			assertNoFragment(t, "RedactedDSN", pg.RedactedDSN(), password)

			// The whole DSN in a variable goes in as it is.
			yml := strings.Replace(minimal, `"postgres://outboxd@127.0.0.1/km0"`, `"${DSN}"`, 1)
			_, err = config.Parse([]byte(yml), env(map[string]string{"DSN": tt.dsn}), nil)
			assertErr(t, err, "line 3: postgres.dsn: not a valid connection string: "+tt.reason)
			if err != nil {
				assertNoFragment(t, "Parse error", err.Error(), password)
				assertNoFragment(t, "Parse error", err.Error(), choked)
			}
		})
	}
}

// assertNoFragment fails if s holds any 4 consecutive bytes of secret (all
// of it when shorter).
func assertNoFragment(t *testing.T, what, s, secret string) {
	t.Helper()
	n := min(4, len(secret))
	if strings.Trim(secret, " ") == "" || n < 2 {
		return // too short to tell from the text around it
	}
	for i := 0; i+n <= len(secret); i++ {
		if frag := secret[i : i+n]; strings.Contains(s, frag) {
			t.Errorf("%s %q holds %q, a piece of the password %q", what, s, frag, secret)
			return
		}
	}
}

func TestPasswordFile(t *testing.T) {
	files := fileReader(map[string]string{
		"/s/two-newlines": "pw\n\n",
		"/s/crlf":         "pw\r\n",
		"/s/empty":        "\n",
		"/s/secret":       "s3cr3t\n",
	})
	withKeys := func(keys string) string {
		return strings.Replace(minimal, "  slot:", keys+"\n  slot:", 1)
	}
	tests := []struct {
		name     string
		yml      string
		readFile func(string) ([]byte, error)
		want     string   // the password, when no error
		wantErr  []string // substrings
	}{
		{name: "only one newline is trimmed", yml: withKeys("  password_file: /s/two-newlines"), readFile: files, want: "pw\n"},
		{name: "a CRLF is one newline", yml: withKeys("  password_file: /s/crlf"), readFile: files, want: "pw"},
		{name: "the path expands variables", yml: withKeys("  password_file: ${DIR}/secret"), readFile: files, want: "s3cr3t"},
		{name: "with postgres.password", yml: withKeys("  password: x\n  password_file: /s/secret"), readFile: files,
			wantErr: []string{"line 5: postgres.password_file: set together with postgres.password (line 4): keep one"}},
		{name: "missing file", yml: withKeys("  password_file: /s/missing"), readFile: files,
			wantErr: []string{"line 4: postgres.password_file: open /s/missing: file does not exist"}},
		{name: "empty file", yml: withKeys("  password_file: /s/empty"), readFile: files,
			wantErr: []string{"line 4: postgres.password_file: /s/empty is empty"}},
		{name: "no reader", yml: withKeys("  password_file: /s/secret"), readFile: nil,
			wantErr: []string{"line 4: postgres.password_file: /s/secret: no file can be read"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tt.yml), env(map[string]string{"DIR": "/s"}), tt.readFile)
			if tt.wantErr != nil {
				assertErr(t, err, tt.wantErr...)
				assertNoFragment(t, "error", err.Error(), "s3cr3t")
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if cfg.Postgres.Password != tt.want {
				t.Errorf("Password = %q, want %q", cfg.Postgres.Password, tt.want)
			}
		})
	}
}

// Whatever the password, a DSN that encodes it correctly is redacted to the
// same text, and RedactedDSN takes any string. Run with -fuzz to search.
func FuzzRedactedDSN(f *testing.F) {
	for _, pw := range passwords {
		f.Add(pw)
	}
	f.Add("postgres://u:p@ss@h/db?password=x#y")
	f.Fuzz(func(t *testing.T, pw string) {
		_ = config.Postgres{DSN: pw}.RedactedDSN() // any input
		if pw == "" {
			return
		}
		u := (&url.URL{Scheme: "postgres", User: url.UserPassword("outboxd", pw), Host: "db", Path: "/km0"}).String()
		if got, want := (config.Postgres{DSN: u}).RedactedDSN(), "postgres://outboxd:xxxxx@db/km0"; got != want {
			t.Errorf("RedactedDSN(%q) = %q, want %q", u, got, want)
		}
		kv := "host=db password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "' dbname=km0"
		if got, want := (config.Postgres{DSN: kv}).RedactedDSN(), "host=db password=xxxxx dbname=km0"; got != want {
			t.Errorf("RedactedDSN(%q) = %q, want %q", kv, got, want)
		}
	})
}

// Whatever a variable holds, the connection gets it as the password, in
// either form of DSN. Run with -fuzz to search.
func FuzzPasswordInDSN(f *testing.F) {
	for _, pw := range passwords {
		f.Add(pw)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		for _, dsn := range []string{
			"postgres://outboxd:${PW}@db.internal:5432/km0",
			"postgres://outboxd@db.internal:5432/km0?password=${PW}",
			"host=db.internal password=${PW} dbname=km0 user=outboxd",
			"host=db.internal password='${PW}' dbname=km0 user=outboxd",
		} {
			yml := strings.Replace(minimal, `"postgres://outboxd@127.0.0.1/km0"`, `"`+dsn+`"`, 1)
			cfg, err := config.Parse([]byte(yml), env(map[string]string{"PW": pw}), nil)
			if err != nil {
				t.Fatalf("%s with PW=%q: %v", dsn, pw, err)
			}
			cc, err := cfg.Postgres.ConnConfig()
			if err != nil {
				t.Fatalf("%s with PW=%q: %v", dsn, pw, err)
			}
			if cc.Password != pw || cc.Host != "db.internal" || cc.Database != "km0" || cc.User != "outboxd" {
				t.Errorf("%s with PW=%q: DSN %q gives password %q, host %q, database %q, user %q",
					dsn, pw, cfg.Postgres.DSN, cc.Password, cc.Host, cc.Database, cc.User)
			}
		}
	})
}

func TestKafkaSASLPasswordFile(t *testing.T) {
	yml := strings.Replace(minimal, "kafka:\n", "kafka:\n  tls: {enable: true}\n  sasl:\n    mechanism: SCRAM-SHA-512\n    username: outboxd\n    password_file: /run/secrets/kafka\n", 1)
	files := func(path string) ([]byte, error) {
		if path == "/run/secrets/kafka" {
			return []byte("k@fk\"a pw\n"), nil
		}
		return nil, fs.ErrNotExist
	}
	cfg, err := config.Parse([]byte(yml), nil, files)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kafka.SASL.Password != `k@fk"a pw` {
		t.Errorf("password %q", cfg.Kafka.SASL.Password)
	}
	both := strings.Replace(yml, "    password_file:", "    password: inline\n    password_file:", 1)
	if _, err := config.Parse([]byte(both), nil, files); err == nil || !strings.Contains(err.Error(), "kafka.sasl.password_file: set together with kafka.sasl.password") {
		t.Errorf("both: %v", err)
	}
}

// TestPostgresTLS: postgres.tls becomes libpq's settings, over the DSN's,
// in both DSN forms.
func TestPostgresTLS(t *testing.T) {
	for _, dsn := range []string{"postgres://outboxd@db.internal:5432/km0?sslmode=disable", "host=db.internal dbname=km0 user=outboxd sslmode=disable"} {
		yml := strings.Replace(minimal, `dsn: "postgres://outboxd@127.0.0.1/km0"`, `dsn: "`+dsn+`"`+"\n  tls:\n    mode: verify-full\n    ca_file: testdata/ca.pem", 1)
		cfg, err := config.Parse([]byte(yml), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := cfg.Postgres.ConnConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cc.TLSConfig == nil || cc.TLSConfig.ServerName != "db.internal" || cc.TLSConfig.RootCAs == nil || cc.TLSConfig.InsecureSkipVerify && cc.TLSConfig.VerifyPeerCertificate == nil {
			t.Errorf("%s: TLS %+v", dsn, cc.TLSConfig)
		}
		if len(cc.Fallbacks) != 0 {
			t.Errorf("%s: verify-full must not fall back to plaintext: %d fallbacks", dsn, len(cc.Fallbacks))
		}
	}
}

// TestTLSWarning: a DSN that reaches PostgreSQL over the network below
// verify-full is a warning that names the host and the fix; one on this
// machine, or verified, is not; postgres.tls.ca_file alone verifies.
func TestTLSWarning(t *testing.T) {
	t.Setenv("PGSSLMODE", "")
	tests := []struct {
		name, dsn string
		tls       config.PostgresTLS
		want      string // in the warning; "" for none
	}{
		{name: "libpq's default over the network", dsn: "postgres://outboxd:s3cr3t@db.internal:5432/km0", want: "db.internal:5432 over TLS without checking the server's certificate, or in plaintext"},
		{name: "require", dsn: "postgres://outboxd@db.internal/km0?sslmode=require", want: "(sslmode require)"},
		{name: "disable", dsn: "host=10.0.0.7 port=5433 user=outboxd sslmode=disable", want: "10.0.0.7:5433 in plaintext"},
		{name: "verify-ca", dsn: "postgres://outboxd@db.internal/km0", tls: config.PostgresTLS{Mode: "verify-ca", CAFile: "testdata/ca.pem"}, want: "(sslmode verify-ca)"},
		{name: "a second host over the network", dsn: "postgres://outboxd@127.0.0.1:5432,db.internal:5432/km0?sslmode=disable", want: "at db.internal:5432 in plaintext"},
		{name: "verify-full", dsn: "postgres://outboxd@db.internal/km0", tls: config.PostgresTLS{Mode: "verify-full", CAFile: "testdata/ca.pem"}},
		{name: "ca_file alone is verify-full", dsn: "postgres://outboxd@db.internal/km0?sslmode=disable", tls: config.PostgresTLS{CAFile: "testdata/ca.pem"}},
		{name: "loopback", dsn: "postgres://outboxd@127.0.0.1:5432/km0?sslmode=disable"},
		{name: "localhost", dsn: "host=localhost user=outboxd"},
		{name: "IPv6 loopback", dsn: "postgres://outboxd@[::1]:5432/km0"},
		{name: "a Unix socket", dsn: "host=/var/run/postgresql user=outboxd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pg := config.Postgres{DSN: tt.dsn, TLS: tt.tls}
			detail, fix := pg.TLSWarning()
			if tt.want == "" {
				if detail != "" {
					t.Errorf("warning %q, want none", detail)
				}
				return
			}
			if !strings.Contains(detail, tt.want) || !strings.Contains(fix, "postgres.tls.mode: verify-full") {
				t.Errorf("warning %q (fix %q), want one holding %q", detail, fix, tt.want)
			}
			assertNoFragment(t, "warning", detail, "s3cr3t")
		})
	}
	cc, err := config.Postgres{DSN: "postgres://outboxd@db.internal/km0", TLS: config.PostgresTLS{CAFile: "testdata/ca.pem"}}.ConnConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cc.TLSConfig == nil || cc.TLSConfig.InsecureSkipVerify || cc.TLSConfig.ServerName != "db.internal" || len(cc.Fallbacks) != 0 {
		t.Errorf("ca_file alone: TLS %+v, %d fallbacks; want verify-full", cc.TLSConfig, len(cc.Fallbacks))
	}
}
