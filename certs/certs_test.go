package certs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCAPool(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CAPool(notPEM); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("a file without a certificate: %v", err)
	}
	if _, err := CAPool(filepath.Join(dir, "missing.pem")); err == nil || !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}
