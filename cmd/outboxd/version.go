package main

import (
	"fmt"
	"io"

	"github.com/outboxd/outboxd"
)

// printVersion prints "outboxd VERSION (GOVERSION, commit REV)".
func printVersion(w io.Writer) {
	b := outboxd.BuildInfo()
	commit := ""
	if b.Commit != "" {
		commit = ", commit " + b.Commit
		if b.Modified {
			commit += " (modified)"
		}
	}
	fmt.Fprintf(w, "outboxd %s (%s%s)\n", b.Version, b.GoVersion, commit)
}
