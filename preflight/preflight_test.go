package preflight

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/catalog"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/postgres"
	"github.com/outboxd/outboxd/sink"
)

func route() config.Route {
	return config.Route{Table: "public.outbox", Schema: "public", Name: "outbox", Topic: "t", Columns: config.DefaultColumns()}
}

// evalTable is evalRoute for r alone, its keys without a line.
func evalTable(r config.Route, relkind string, cols map[string]column) Result {
	cfg := config.Default()
	cfg.Routes = []config.Route{r}
	m := cfg.Routing()
	return evalRoute(&m.Routes[0], func(use string) string { return "routes[]." + use }, relkind, cols)
}

func seedColumns() map[string]column {
	return map[string]column{
		"id": {"uuid", "uuid"}, "agregat": {"text", "text"}, "agregat_id": {"text", "text"}, "tipus": {"text", "text"},
		"versio": {"integer", "int4"}, "carrega": {"jsonb", "jsonb"}, "creat_en": {"timestamp with time zone", "timestamptz"},
	}
}

func TestEvalTable(t *testing.T) {
	debezium := route()
	debezium.Columns = config.Columns{ID: "id", AgregatID: "aggregateid", Tipus: "type", Versio: "", Carrega: "payload", CreatEn: "timestamp"}
	renamed := route()
	renamed.Columns.Tipus = "kind"
	tests := []struct {
		name    string
		r       config.Route
		relkind string
		change  func(map[string]column)
		status  string
		want    []string // substrings of Detail (+ Fix)
	}{
		{"seed table", route(), "r", nil, Pass, []string{"agregat_id text", "creat_en timestamp with time zone"}},
		{"debezium names, no versio", debezium, "r", func(c map[string]column) {
			for _, k := range []string{"agregat_id", "tipus", "versio", "carrega", "creat_en"} {
				delete(c, k)
			}
			c["aggregateid"], c["type"] = column{"character varying(255)", "varchar"}, column{"character varying(255)", "varchar"}
			c["payload"], c["timestamp"] = column{"json", "json"}, column{"timestamp with time zone", "timestamptz"}
		}, Pass, []string{"versio -", "payload json"}},
		{"versio as text, carrega as text, domain over text", route(), "r", func(c map[string]column) {
			c["versio"], c["carrega"], c["tipus"] = column{"text", "text"}, column{"text", "text"}, column{"tipus_t", "text"}
		}, Pass, nil},
		{"partitioned table", route(), "p", nil, Pass, nil},
		{"view", route(), "v", nil, Fail, []string{"not a table"}},
		{"missing column", renamed, "r", nil, Fail, []string{"column kind (columns.tipus) does not exist", "agregat_id, carrega"}},
		{"timestamp without time zone", route(), "r", func(c map[string]column) {
			c["creat_en"] = column{"timestamp without time zone", "timestamp"}
		}, Fail, []string{"ambiguous", "TYPE timestamptz"}},
		{"numeric versio", route(), "r", func(c map[string]column) { c["versio"] = column{"numeric", "numeric"} }, Fail, []string{"(columns.versio) is numeric"}},
		{"uuid key", route(), "r", func(c map[string]column) { c["agregat_id"] = column{"uuid", "uuid"} }, Pass, nil},
		{"bytea key", route(), "r", func(c map[string]column) { c["agregat_id"] = column{"bytea", "bytea"} }, Fail, []string{"agregat_id (columns.agregat_id) is bytea"}},
		{"bytea carrega", route(), "r", func(c map[string]column) { c["carrega"] = column{"bytea", "bytea"} }, Fail, []string{"jsonb, json or text"}},
		{"id of any type", route(), "r", func(c map[string]column) { c["id"] = column{"bigint", "int8"} }, Pass, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cols := seedColumns()
			if tc.change != nil {
				tc.change(cols)
			}
			got := evalTable(tc.r, tc.relkind, cols)
			check(t, got, tc.status, tc.want...)
		})
	}
}

func check(t *testing.T, got Result, status string, want ...string) {
	t.Helper()
	if got.Status != status {
		t.Fatalf("status %s, want %s: %s", got.Status, status, got)
	}
	if (status == Fail || status == Warn) && got.Fix == "" {
		t.Errorf("a %s without a fix: %s", status, got)
	}
	for _, w := range want {
		if !strings.Contains(got.String(), w) {
			t.Errorf("%q lacks %q", got, w)
		}
	}
}

func TestEvalPublication(t *testing.T) {
	cfg := config.Default()
	cfg.Postgres.Publication = "pub"
	cfg.Routes = []config.Route{route()}
	noCreate := cfg
	noCreate.Postgres.CreatePublication = false
	outbox := catalog.Table{Schema: "public", Name: "outbox"}
	covered := map[catalog.Table]catalog.PublishedTable{outbox: {}}
	exists := func(inserts, all bool, tables map[catalog.Table]catalog.PublishedTable) publication {
		return publication{Publication: catalog.Publication{Name: "pub", Exists: true, Inserts: inserts, AllTables: all, Tables: tables}}
	}
	tests := []struct {
		name   string
		cfg    config.Config
		p      publication
		status string
		want   []string
	}{
		{"absent, superuser", cfg, publication{super: true}, Pass, []string{"will be created"}},
		{"absent, owner", cfg, publication{mayCreateInDB: true}, Pass, []string{"will be created"}},
		{"absent, not owner", cfg, publication{mayCreateInDB: true, notOwned: []string{"public.outbox"}}, Fail, []string{"does not own public.outbox", "sql/002_publication.sql"}},
		{"absent, no CREATE on the database", cfg, publication{}, Fail, []string{"lacks CREATE"}},
		{"absent, may not create", noCreate, publication{super: true}, Fail, []string{"create_publication is false", "sql/002_publication.sql", `CREATE PUBLICATION "pub" FOR TABLE "public"."outbox"`}},
		{"good", cfg, exists(true, false, covered), Pass, []string{"publishes inserts of public.outbox"}},
		{"no inserts", cfg, exists(false, false, covered), Fail, []string{"does not publish inserts", "publish = 'insert'"}},
		{"all tables", cfg, exists(true, true, nil), Fail, []string{"FOR ALL TABLES"}},
		{"table not covered", cfg, exists(true, false, map[catalog.Table]catalog.PublishedTable{}), Fail, []string{"does not cover public.outbox", "ADD TABLE"}},
		{"unrouted table", cfg, exists(true, false, map[catalog.Table]catalog.PublishedTable{outbox: {}, {Schema: "public", Name: "comandes"}: {}}), Fail, []string{"public.comandes, which has no route"}},
		{"column list without creat_en", cfg, exists(true, false, map[catalog.Table]catalog.PublishedTable{outbox: {Columns: []string{"id", "agregat_id", "tipus", "versio", "carrega"}}}), Fail, []string{"leaves out creat_en"}},
		{"column list with every mapped column", cfg, exists(true, false, map[catalog.Table]catalog.PublishedTable{outbox: {Columns: []string{"id", "agregat_id", "tipus", "versio", "carrega", "creat_en"}}}), Pass, nil},
		{"row filter", cfg, exists(true, false, map[catalog.Table]catalog.PublishedTable{outbox: {RowFilter: "(tipus <> 'x')"}}), Fail, []string{"never delivered"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check(t, evalPublication(newTarget(tc.cfg), tc.p), tc.status, tc.want...) })
	}
}

func TestEvalSlot(t *testing.T) {
	pg := config.Default().Postgres
	pg.Slot = "s"
	pg.Snapshot = config.SnapshotNone
	fixed := pg
	fixed.CreateSlot = false
	snap := pg
	snap.Snapshot = config.SnapshotPending
	good := catalog.Slot{Name: "s", Plugin: "pgoutput", Type: "logical", Database: "db", SameDatabase: true, ConfirmedFlush: 0x16B3748, CurrentWAL: 0x16B3748 + 120, WALStatus: "reserved"}
	with := func(f func(*catalog.Slot)) *catalog.Slot { s := good; f(&s); return &s }
	tests := []struct {
		name   string
		pg     config.Postgres
		s      *catalog.Slot
		c      cutover
		status string
		want   []string
	}{
		{"absent, create", pg, nil, cutover{}, Pass, []string{"will be created", "current WAL position"}},
		{"absent, create with a snapshot", snap, nil, cutover{pending: []string{"public.outbox: 102"}}, Pass, []string{"exported snapshot", "public.outbox: 102"}},
		{"unfinished cut-over", snap, &good, cutover{marker: true, pending: []string{"public.outbox: 7"}}, Pass, []string{"did not finish", "keeps its slot", "0/16B3748", "publishes the rows pending now (public.outbox: 7)"}},
		{"unfinished cut-over, no slot", snap, nil, cutover{marker: true, pending: []string{"public.outbox: 7"}}, Pass, []string{"before its slot was created", "exported snapshot", "(public.outbox: 7)"}},
		{"unfinished cut-over, slot lost", snap, with(func(s *catalog.Slot) { s.WALStatus = "lost" }), cutover{marker: true, pending: []string{"public.outbox: 7"}}, Warn,
			[]string{"cannot be streamed from", "wal_status lost", "drops it", "(public.outbox: 7)", "logical messages", "outboxd replay"}},
		{"unfinished cut-over, snapshot none", pg, &good, cutover{marker: true}, Pass, []string{"gives it up"}},
		{"unfinished cut-over, no create", fixed, &good, cutover{marker: true}, Fail, []string{"did not finish", "create_slot is false", "s_snapshot"}},
		{"absent, no create", fixed, nil, cutover{}, Fail, []string{"does not exist", "create_slot"}},
		{"good", pg, &good, cutover{}, Pass, []string{"0/16B3748", "reserved", "120 bytes"}},
		{"extended", pg, with(func(s *catalog.Slot) { s.WALStatus = "extended" }), cutover{}, Pass, nil},
		{"wrong plugin", pg, with(func(s *catalog.Slot) { s.Plugin = "wal2json" }), cutover{}, Fail, []string{"wal2json"}},
		{"physical", pg, with(func(s *catalog.Slot) { s.Type, s.Plugin = "physical", "" }), cutover{}, Fail, []string{"physical"}},
		{"other database", pg, with(func(s *catalog.Slot) { s.SameDatabase, s.Database = false, "other" }), cutover{}, Fail, []string{"belongs to database other"}},
		{"lost", pg, with(func(s *catalog.Slot) { s.WALStatus = "lost" }), cutover{}, Fail, []string{"wal_status lost"}},
		// PostgreSQL 18: invalidated for idleness, wal_status still reserved.
		{"idle_timeout", pg, with(func(s *catalog.Slot) { s.Invalidated = "idle_timeout" }), cutover{}, Fail,
			[]string{"cannot be streamed from", "idle_timeout", "idle_replication_slot_timeout"}},
		{"unreserved", pg, with(func(s *catalog.Slot) { s.WALStatus = "unreserved" }), cutover{}, Fail, []string{"unreserved", "warning", "max_slot_wal_keep_size"}},
		// A running outboxd holds its slot: the normal state, a pass that names the holder.
		{"active, held by outboxd", pg, with(func(s *catalog.Slot) {
			s.Active, s.ActivePID, s.Holder, s.HolderAddr = true, 4242, "outboxd", "10.0.0.7"
		}), cutover{}, Pass,
			[]string{"streaming to PID 4242 (outboxd from 10.0.0.7)"}},
		{"active, holder not visible", pg, with(func(s *catalog.Slot) { s.Active, s.ActivePID = true, 4242 }), cutover{}, Pass, []string{"PID 4242 (another outboxd, or a client this role cannot see)"}},
		{"active, held by another client", pg, with(func(s *catalog.Slot) { s.Active, s.ActivePID, s.Holder = true, 4242, "pg_recvlogical" }), cutover{}, Fail, []string{`PID 4242, a client named "pg_recvlogical"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check(t, evalSlot(tc.pg, tc.s, tc.c), tc.status, tc.want...) })
	}
}

// TestEvalRole: a role may replicate as the server decides it (superuser,
// REPLICATION, or on Amazon RDS and Aurora membership of rds_replication);
// the line names the managed service's way, and a FAIL's fix names that
// service's way, or every way where no service was recognised.
func TestEvalRole(t *testing.T) {
	rds, cloudSQL := postgres.RDS, postgres.CloudSQL
	for _, tc := range []struct {
		name   string
		r      role
		svc    *postgres.Service
		status string
		want   []string
	}{
		{"REPLICATION", role{name: "u", repl: true}, nil, Pass, []string{"u has REPLICATION"}},
		{"superuser", role{name: "u", super: true}, nil, Pass, []string{"superuser"}},
		{"rds_replication member", role{name: "u", rdsReplication: true}, &rds, Pass,
			[]string{"member of rds_replication", "Amazon RDS and Aurora's way", "docs/managed-postgres.md#amazon-rds-and-aurora"}},
		{"REPLICATION on Cloud SQL", role{name: "u", repl: true}, &cloudSQL, Pass,
			[]string{"Google Cloud SQL for PostgreSQL's way", `ALTER USER "u" WITH REPLICATION`, "cloudsqlsuperuser"}},
		{"neither, self-managed", role{name: "u"}, nil, Fail, []string{
			"neither REPLICATION nor SUPERUSER nor membership of rds_replication",
			`as a superuser: ALTER ROLE "u" REPLICATION (see sql/003_role.sql)`,
			`Amazon RDS and Aurora: GRANT rds_replication TO "u"`,
			"cloudsqlsuperuser", "alloydbsuperuser", "azure_pg_admin", "neon_superuser", "docs/managed-postgres.md"}},
		{"neither, on RDS", role{name: "u"}, &rds, Fail, []string{"on Amazon RDS for PostgreSQL", `GRANT rds_replication TO "u"`, "#amazon-rds-and-aurora"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := evalRole(tc.r, tc.svc)
			check(t, got, tc.status, tc.want...)
			if tc.status == Fail && tc.svc != nil && strings.Contains(got.Fix, "as a superuser") {
				t.Errorf("on %s the fix gives a superuser's statement: %s", tc.svc.Name, got)
			}
		})
	}
}

// TestServiceOf: each service is recognised from the settings it
// documents (Aurora before RDS, whose settings it shares); a self-managed
// server's are none of them.
func TestServiceOf(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string // "" : none
	}{
		{nil, ""},
		{[]string{"pg_stat_statements.max", "auto_explain.log_min_duration"}, ""},
		{[]string{"rds.extensions", "rds.logical_replication"}, postgres.RDS.Name},
		{[]string{"rds.extensions", "apg_plan_mgmt.capture_plan_baselines"}, postgres.Aurora.Name},
		{[]string{"rds.extensions", auroraVersion}, postgres.Aurora.Name},
		{[]string{"cloudsql.logical_decoding"}, postgres.CloudSQL.Name},
		{[]string{"alloydb.logical_decoding"}, postgres.AlloyDB.Name},
		{[]string{"azure.extensions"}, postgres.Azure.Name},
		{[]string{"neon.timeline_id"}, postgres.Neon.Name},
		{[]string{"rdsx.foo", "azurefoo"}, ""},
	} {
		got := serviceOf(tc.names)
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("serviceOf(%q) = %s; want none", tc.names, got.Name)
		case tc.want != "" && (got == nil || got.Name != tc.want):
			t.Errorf("serviceOf(%q) = %v; want %s", tc.names, got, tc.want)
		}
	}
}

func TestEvalServer(t *testing.T) {
	check(t, evalWalLevel("logical", nil), Pass)
	check(t, evalWalLevel("replica", nil), Fail, "wal_level is replica", "wal_level = logical", "docs/managed-postgres.md")
	rds := postgres.RDS
	check(t, evalWalLevel("replica", &rds), Fail, "rds.logical_replication to 1", "#amazon-rds-and-aurora")

	tests := []struct {
		c      capacity
		slots  string
		sender string
	}{
		{capacity{maxSlots: 10, usedSlots: 3, maxSenders: 10, usedSenders: 2}, Pass, Pass},
		{capacity{maxSlots: 3, usedSlots: 3, slotExists: true, maxSenders: 10}, Pass, Pass},
		{capacity{maxSlots: 3, usedSlots: 3, maxSenders: 10}, Fail, Pass},
		{capacity{maxSlots: 10, maxSenders: 2, usedSenders: 2}, Pass, Fail},
		{capacity{maxSlots: 10, slotExists: true, slotActive: true, maxSenders: 2, usedSenders: 2}, Pass, Pass}, // ours is one of them
		{capacity{maxSlots: 0, maxSenders: 0}, Fail, Fail},
	}
	for _, tc := range tests {
		got := evalCapacity(tc.c)
		check(t, got[0], tc.slots)
		check(t, got[1], tc.sender)
	}
}

func TestEvalKafka(t *testing.T) {
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	check(t, evalKafka([]brokerDial{{"a:9092", nil}}, []brokerDial{{"a:9092", nil}}), Pass, "1 of 1 brokers reachable")
	check(t, evalKafka([]brokerDial{{"a:9092", nil}, {"127.0.0.1:1", refused}}, nil), Fail, "1 of 2 brokers reachable", "connection refused")
	check(t, evalKafka([]brokerDial{{"127.0.0.1:1", refused}}, nil), Fail, "0 of 1 brokers reachable")
	check(t, evalKafka([]brokerDial{{"a:9092", nil}}, []brokerDial{{"kafka-0:9092", errors.New("no such host")}}), Fail, "advertised.listeners")
	check(t, evalIdempotence(false, nil), Pass, "off (kafka.idempotence: false)", "may duplicate")
	check(t, evalIdempotence(true, nil), Pass, "producer id")
	check(t, evalIdempotence(true, errors.New("dial tcp: i/o timeout")), Warn, "could not ask", "i/o timeout")
	check(t, evalIdempotence(true, &sink.IdempotenceError{Why: "the brokers refused outboxd's principal a producer id", Fix: "grant it WRITE", Err: kafka.ClusterAuthorizationFailed}),
		Fail, "refused outboxd's principal", "Cluster Authorization Failed", "grant it WRITE")
	check(t, evalTopic("t", 3, false), Pass, "3 partition(s)")
	check(t, evalTopic("t", 0, true), Pass, "will be created if the broker's auto.create.topics.enable is true")
	check(t, evalTopic("t", 0, false), Fail, "does not ask the broker to create", "kafka-topics.sh --create --topic t")
}

func TestResultLines(t *testing.T) {
	for _, tc := range []struct {
		r    Result
		want string
	}{
		{Result{"wal_level", Pass, "logical", ""}, "PASS wal_level: logical"},
		{Result{"role", Fail, "no REPLICATION", "ALTER ROLE"}, "FAIL role: no REPLICATION — fix: ALTER ROLE"},
		{Result{"slot", Skip, "skipped: the database is unreachable", ""}, "SKIP slot: skipped: the database is unreachable"},
		{Result{"failover", Warn, "no failover slots", "upgrade"}, "WARN failover: no failover slots — fix: upgrade"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	inv := ConfigInvalid(errors.New("a: line 3: x\na: line 5: y"))
	if inv[0].Status != Fail || strings.Contains(inv[0].String(), "\n") || inv[1].Status != Skip {
		t.Errorf("ConfigInvalid: %v", inv)
	}
}

// TestEvalDedupe: the kafka deduplicate line: off, on without idempotence
// (nothing skipped: a WARN), a topic the principal may not READ (a WARN
// with the ACL), a topic not created yet (nothing to read: no warning),
// every tail readable.
func TestEvalDedupe(t *testing.T) {
	denied := fmt.Errorf("fetch: %w", kafka.TopicAuthorizationFailed)
	for _, tc := range []struct {
		name        string
		on, idem    bool
		probes      map[string]error
		status      string
		detail, fix string
	}{
		{"off", false, true, nil, Pass, "off (kafka.deduplicate: false)", ""},
		{"without idempotence", true, false, nil, Warn, "kafka.idempotence is off", "kafka.idempotence: true"},
		{"no READ", true, true, map[string]error{"comandes": denied, "pagaments": nil}, Warn, "may not READ comandes", "--operation Read --topic comandes"},
		{"readable", true, true, map[string]error{"comandes": nil, "pagaments": nil}, Pass, "2 topic(s) readable", ""},
		{"another failure", true, true, map[string]error{"comandes": errors.New("i/o timeout")}, Warn, "could not read the tail of comandes", "brokers' logs"},
	} {
		r := evalDedupe(tc.on, tc.idem, tc.probes)
		if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) || !strings.Contains(r.Fix, tc.fix) {
			t.Errorf("%s: %v %q (fix %q)", tc.name, r.Status, r.Detail, r.Fix)
		}
	}
}

// TestEvalStreamKey: the kafka stream key line (issue 32): a key there or
// to be made passes; none configured, or none that can be made, warns
// (restarts duplicate); a file there but unusable fails, as run would.
func TestEvalStreamKey(t *testing.T) {
	notKept := fmt.Errorf("make /etc/outboxd/k: %w: %w", sink.ErrStreamKeyNotKept, os.ErrPermission)
	for _, tc := range []struct {
		name        string
		path        string
		exists      bool
		err         error
		status      string
		detail, fix string
	}{
		{"there", "/k", true, nil, Pass, "/k (every instance", ""},
		{"to be made", "/k", false, nil, Pass, "the first start makes it", ""},
		{"empty", "", false, nil, Warn, "kafka.stream_key_file is empty", "every instance of the slot shares"},
		{"cannot be made", "/etc/outboxd/k", false, notKept, Warn, "cannot be made", "make its directory writable"},
		{"too short", "/k", true, errors.New("stream key /k: 4 bytes, want at least 16"), Fail, "would stop", "openssl rand -hex 32"},
	} {
		r := evalStreamKey(tc.path, tc.exists, tc.err)
		if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) || !strings.Contains(r.Fix, tc.fix) {
			t.Errorf("%s: %v %q (fix %q)", tc.name, r.Status, r.Detail, r.Fix)
		}
	}
}

func TestEvalTransactions(t *testing.T) {
	refused := &sink.IdempotenceError{Why: "the brokers refused outboxd's principal the transactional id \"x\"", Fix: "--transactional-id x", Err: kafka.TransactionalIDAuthorizationFailed}
	for _, tc := range []struct {
		name        string
		on          bool
		probe       error
		status      string
		detail, fix string
	}{
		{"off", false, nil, Pass, "off (kafka.transactions: false)", ""},
		{"coordinator", true, nil, Pass, "transactional id x, coordinator broker 3", ""},
		{"no ACL", true, refused, Fail, "refused outboxd's principal the transactional id", "--transactional-id x"},
		{"no coordinator", true, errors.New("i/o timeout"), Warn, "no coordinator for transactional id x", "brokers' logs"},
	} {
		r := evalTransactions(tc.on, "x", 3, tc.probe)
		if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) || !strings.Contains(r.Fix, tc.fix) {
			t.Errorf("%s: %v %q (fix %q)", tc.name, r.Status, r.Detail, r.Fix)
		}
	}
}
