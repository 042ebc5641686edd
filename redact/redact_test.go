package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"https://key:s3cr3t@registry:8081", "https://key:xxxxx@registry:8081"},
		{"https://key:s3cr3t@registry:8081/apis/ccompat/v7", "https://key:xxxxx@registry:8081/apis/ccompat/v7"},
		{"http://collector:4318", "http://collector:4318"},
		{"http://collector:4318/v1/traces?api_token=s3cr3t&x=1", "http://collector:4318/v1/traces?api_token=xxxxx&x=1"},
		{"http://tk:s3cr3t@collector:4318", "http://tk:xxxxx@collector:4318"},
		{"https://u:s3%zzcr3t@bad", "https://xxxxx"}, // does not parse
		{"not a url", "not a url"},
	} {
		got := URL(tc.raw)
		if got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.raw, got, tc.want)
		}
		if strings.Contains(got, "s3") && strings.Contains(tc.raw, "s3cr3t") {
			t.Errorf("URL(%q) = %q leaks the secret", tc.raw, got)
		}
	}
}
