package testenv

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// dsnVar carries Config.DSN to outboxd: the file says "${TEST_DSN}".
const dsnVar = "TEST_DSN"

// Config is one outboxd configuration file. The sections take outboxd's own
// defaults except for the keys set here.
type Config struct {
	DSN     string // postgres.dsn, passed in the environment as ${TEST_DSN}
	Brokers string // kafka.brokers, "host:port[,host:port...]"
	Slot    string // postgres.slot, and postgres.publication unless Postgres sets it
	Routes  []Route

	// More keys of each section. Postgres["publication"] and
	// Health["listen"] replace what Config and NewDaemon would write.
	Postgres, Kafka, Pipeline, Retention, Health, Log, Tracing Section

	// The process rather than the file: the binary ("" builds this tree's,
	// see Binary) and more environment ("K=V").
	Bin string
	Env []string
}

// Section is keys of one section of the file, each with a YAML value as it
// would be written after "key: ": "200ms", "false", "{id: id, tipus: type}".
type Section map[string]string

// Route is one entry of routes: a table (or, with Message, the logical
// messages of a prefix), its topic, and more keys such as on_error,
// dead_letter_topic or columns.
type Route struct {
	Table, Topic string
	Message      string // instead of Table
	More         Section
}

// YAML is the file.
func (c Config) YAML() string {
	var b strings.Builder
	b.WriteString("origen: comandes\n")
	var brokers []string
	for _, br := range strings.Split(c.Brokers, ",") {
		brokers = append(brokers, fmt.Sprintf("%q", strings.TrimSpace(br)))
	}
	section(&b, "postgres", "  ", Section{"dsn": `"${` + dsnVar + `}"`, "slot": c.Slot, "publication": c.Slot}, c.Postgres)
	section(&b, "kafka", "  ", Section{"brokers": "[" + strings.Join(brokers, ", ") + "]"}, c.Kafka)
	b.WriteString("routes:\n")
	for _, r := range c.Routes {
		if r.Message != "" {
			fmt.Fprintf(&b, "  - message: %s\n", r.Message)
		} else {
			fmt.Fprintf(&b, "  - table: %s\n", r.Table)
		}
		section(&b, "", "    ", Section{"topic": r.Topic}, r.More)
	}
	section(&b, "pipeline", "  ", nil, c.Pipeline)
	section(&b, "retention", "  ", nil, c.Retention)
	section(&b, "health", "  ", nil, c.Health)
	section(&b, "log", "  ", nil, c.Log)
	section(&b, "tracing", "  ", nil, c.Tracing)
	return b.String()
}

// section writes name: and then base's keys, then more's, each key once
// (more wins), in a stable order; nothing when both are empty.
func section(b *strings.Builder, name, indent string, base, more Section) {
	if len(base)+len(more) == 0 {
		return
	}
	if name != "" {
		fmt.Fprintf(b, "%s:\n", name)
	}
	keys := func(s Section) []string {
		var ks []string
		for k := range s {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	for _, k := range keys(base) {
		if _, over := more[k]; !over {
			fmt.Fprintf(b, "%s%s: %s\n", indent, k, base[k])
		}
	}
	for _, k := range keys(more) {
		fmt.Fprintf(b, "%s%s: %s\n", indent, k, more[k])
	}
}

// WriteFile writes the file to path.
func (c Config) WriteFile(path string) error {
	return os.WriteFile(path, []byte(c.YAML()), 0o600)
}
