package config_test

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

func TestEnvExpansion(t *testing.T) {
	tests := []struct {
		name    string
		dsn     string // the dsn line's value, in YAML
		vars    map[string]string
		wantDSN string
		wantErr []string // substrings; nil means success
	}{
		{
			name: "set", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": "secret"},
			wantDSN: "postgres://u:secret@h/db",
		},
		{
			name: "two in one line", dsn: `"postgres://${USR}:${PW}@h/db"`, vars: map[string]string{"USR": "u", "PW": "p"},
			wantDSN: "postgres://u:p@h/db",
		},
		{
			name: "set but empty", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": ""},
			wantDSN: "postgres://u:@h/db",
		},
		{
			name: "double dollar is a literal dollar", dsn: `"postgres://u:pa$$${PW}$$@h/db"`, vars: map[string]string{"PW": "x"},
			wantDSN: "postgres://u:pa$x$@h/db",
		},
		{
			name: "escaped reference is not expanded", dsn: `"postgres://u:$${PW}@h/db"`, vars: nil,
			wantDSN: "postgres://u:${PW}@h/db",
		},
		{
			name: "lone dollar is kept", dsn: `"postgres://u:a$b@h/db"`, vars: nil,
			wantDSN: "postgres://u:a$b@h/db",
		},
		{
			name: "value is not re-expanded", dsn: `"postgres://u:${PW}@h/db"`, vars: map[string]string{"PW": "${OTHER}"},
			wantDSN: "postgres://u:${OTHER}@h/db",
		},
		{
			name: "unset", dsn: `"postgres://u:${PGPASSWORD}@h/db"`, vars: map[string]string{"PW": "x"},
			wantErr: []string{"line 3:", "PGPASSWORD", "not set"},
		},
		{
			name: "newline in value", dsn: `"${PW}"`, vars: map[string]string{"PW": "a\nslot: evil"},
			wantErr: []string{"line 3:", "PW", "line break"},
		},
		{
			name: "invalid name", dsn: `"${1PW}"`, vars: map[string]string{"1PW": "x"},
			wantErr: []string{"line 3:", "invalid variable name", "1PW"},
		},
		{
			name: "unterminated", dsn: `"${PW"`, vars: map[string]string{"PW": "x"},
			wantErr: []string{"line 3:", "unterminated"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yml := strings.Replace(minimal, `"postgres://outboxd@127.0.0.1/km0"`, tt.dsn, 1)
			if yml == minimal {
				t.Fatal("test setup: dsn not replaced")
			}
			cfg, err := config.Parse([]byte(yml), env(tt.vars))
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if cfg.Postgres.DSN != tt.wantDSN {
					t.Errorf("dsn = %q, want %q", cfg.Postgres.DSN, tt.wantDSN)
				}
				return
			}
			assertErr(t, err, tt.wantErr...)
		})
	}

	t.Run("unset variable in a later line names that line", func(t *testing.T) {
		_, err := config.Parse([]byte(minimal+"log:\n  level: ${LEVEL}\n"), env(nil))
		assertErr(t, err, "line 12: environment variable LEVEL is not set")
	})
	t.Run("nil lookupEnv defines nothing", func(t *testing.T) {
		_, err := config.Parse([]byte(minimal+"log:\n  level: ${HOME}\n"), nil)
		assertErr(t, err, "line 12:", "HOME")
	})
	t.Run("all unset variables are reported", func(t *testing.T) {
		_, err := config.Parse([]byte("origen: ${A}\nlog:\n  level: ${B}\n"), env(nil))
		assertErr(t, err, "line 1: environment variable A", "line 3: environment variable B")
	})
}
