package config_test

import (
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
		{"postgres://outboxd:s3/cr3t@db/km0", "postgres://xxxxx@db/km0"}, // unparseable: user info dropped entirely
		{"host=db user=outboxd password=s3cr3t dbname=km0", "host=db user=outboxd password=xxxxx dbname=km0"},
		{"password=s3cr3t host=db", "password=xxxxx host=db"},
		{"host=db password = s3cr3t", "host=db password = xxxxx"},
		{`host=db password='s3 cr\'3t' dbname=km0`, "host=db password=xxxxx dbname=km0"},
		{`host=db password=s3\ cr3t dbname=km0`, "host=db password=xxxxx dbname=km0"},
		{"host=db user=outboxd dbname=km0", "host=db user=outboxd dbname=km0"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.dsn, func(t *testing.T) {
			got := config.Postgres{DSN: tt.dsn}.RedactedDSN()
			if got != tt.want {
				t.Errorf("RedactedDSN(%q) = %q, want %q", tt.dsn, got, tt.want)
			}
			for _, secret := range []string{"s3cr3t", "cr3t", "p%40ss"} {
				if strings.Contains(got, secret) {
					t.Errorf("RedactedDSN(%q) = %q leaks %q", tt.dsn, got, secret)
				}
			}
		})
	}
}
