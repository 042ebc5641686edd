// Package certs reads the certificate files a connection trusts: the one
// place where a ca_file (Kafka's, a schema registry's, the span
// receiver's) becomes a pool of roots.
package certs

import (
	"crypto/x509"
	"fmt"
	"os"
)

// CAPool reads the PEM certificates of the file at path. The error names
// the file, not the setting: the caller says which key held it.
func CAPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
