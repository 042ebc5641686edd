package main

import (
	"testing"

	"github.com/outboxd/outboxd/config"
)

// TestStreamIdentityCoversFate (issue 32, item 3): every input that decides
// a row's topic, partition or dead-letter fate changes the stream
// identity, so that a restart under a changed one skips nothing on the
// proof of records written under the old one: kafka.batch_bytes (a larger
// row is a bad row), the registry's schemas (which rows pass, and a
// registered key's bytes), besides the routes, the partitioner and the
// publication. Settings that decide no fate (the linger) leave it alone,
// so that a restart still de-duplicates.
func TestStreamIdentityCoversFate(t *testing.T) {
	base := config.Default()
	base.Postgres.Slot, base.Postgres.Publication = "outboxd_comandes", "outboxd_comandes"
	base.Routes = []config.Route{{Table: "public.outbox", Topic: "comandes.esdeveniments"}}
	id := streamOf(base, "0:17;")
	for _, c := range []struct {
		name    string
		change  func(*config.Config)
		schemas string
		same    bool
	}{
		{name: "kafka.batch_bytes", change: func(c *config.Config) { c.Kafka.BatchBytes = 4 << 20 }, schemas: "0:17;"},
		{name: "a schema's id", change: func(*config.Config) {}, schemas: "0:18;"},
		{name: "a registered key", change: func(*config.Config) {}, schemas: "0:17:key=19;"},
		{name: "the partitioner", change: func(c *config.Config) { c.Kafka.Partitioner = "crc32" }, schemas: "0:17;"},
		{name: "the publication", change: func(c *config.Config) { c.Postgres.Publication = "other" }, schemas: "0:17;"},
		{name: "a route's topic", change: func(c *config.Config) {
			c.Routes = []config.Route{{Table: "public.outbox", Topic: "comandes.altres"}}
		}, schemas: "0:17;"},
		{name: "the linger", change: func(c *config.Config) { c.Kafka.Linger *= 2 }, schemas: "0:17;", same: true},
	} {
		cfg := base
		cfg.Routes = append([]config.Route(nil), base.Routes...)
		c.change(&cfg)
		if got := streamOf(cfg, c.schemas); (got == id) != c.same {
			t.Errorf("%s changed: identity %q, before %q (want the same: %v)", c.name, got, id, c.same)
		}
	}
	base.Kafka.Deduplicate = false
	if got := streamOf(base, ""); got != "" {
		t.Errorf("with kafka.deduplicate off the identity is %q, want none", got)
	}
}
