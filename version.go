package outboxd

import (
	"runtime"
	"runtime/debug"
)

// Version is the release this binary was built as, set at build time:
//
//	go build -ldflags "-X github.com/outboxd/outboxd.Version=v1.2.3" ./cmd/outboxd
//
// (make build passes `git describe`; the Dockerfile its VERSION argument).
var Version = "dev"

// Build describes the running binary.
type Build struct {
	Version   string // Version
	GoVersion string // the toolchain that compiled it
	Commit    string // vcs.revision from the build info, "" when built outside a checkout
	Modified  bool   // the checkout had uncommitted changes
}

// BuildInfo reports Version with what the Go toolchain recorded.
func BuildInfo() Build {
	b := Build{Version: Version, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}
