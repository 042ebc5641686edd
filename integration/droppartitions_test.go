package integration_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/testenv"
)

// dropSchema is the partitioned outbox without partitions.
const dropSchema = testenv.PartitionedOutbox

// TestDropPartitionsSteadyWriter: a service writes at a steady rate into
// short partitions (5 s here; OUTBOXD_DROP_WIDTH=1m OUTBOXD_DROP_RUN=5m
// for per-minute partitions over five minutes) while retention.mode
// drop_partitions drops them, with Kafka stopped for a while in the
// middle. Every event arrives once; every partition dropped held only
// rows the slot had confirmed before it went (the slot's position read
// before the partition vanished is past the end of every transaction that
// wrote into it); no partition goes while Kafka is down; the outbox keeps
// no partition older than max_age; the metrics count what went.
//
// "concurrently": no default partition, so DETACH ... CONCURRENTLY; "with a
// default partition": DETACH and DROP in one transaction, and the default
// stays; with postgres.mark_published, whose UPDATEs through the outbox
// lock every partition (retention holds no lock while it waits for the
// slot, or the marks would wait for it and the slot for the marks).
func TestDropPartitionsSteadyWriter(t *testing.T) {
	width, run := 5*time.Second, 36*time.Second
	if v := os.Getenv("OUTBOXD_DROP_WIDTH"); v != "" {
		width = mustDuration(t, v)
	}
	if v := os.Getenv("OUTBOXD_DROP_RUN"); v != "" {
		run = mustDuration(t, v)
	}
	t.Run("concurrently", func(t *testing.T) { dropPartitionsRun(t, width, run, false, false) })
	t.Run("with a default partition and mark_published", func(t *testing.T) { dropPartitionsRun(t, width, run*2/3, true, true) })
}

func mustDuration(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// writtenRow is a row the writer committed: its partition, and the WAL
// insert position read right after its commit (past the commit's end).
type writtenRow struct {
	id, part string
	after    pglogrepl.LSN
}

// partSample is what the watcher saw at one moment.
type partSample struct {
	at        time.Time
	confirmed pglogrepl.LSN
	parts     map[string]bool
	bytes     int64
}

func dropPartitionsRun(t *testing.T, width, run time.Duration, withDefault, marks bool) {
	f := newFixture(t, dropSchema, map[string]int{"comandes": 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	topic := f.topic("comandes")
	maxAge := 2 * width
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(context.Background(), f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	partName := func(start time.Time) string { return fmt.Sprintf("outbox_p%d", start.Unix()) }
	makeParts := func(c *pgx.Conn, from, to time.Time) error {
		for s := from.Truncate(width); s.Before(to); s = s.Add(width) {
			if _, err := c.Exec(ctx, fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')",
				partName(s), s.UTC().Format(time.RFC3339Nano), s.Add(width).UTC().Format(time.RFC3339Nano))); err != nil {
				return err
			}
		}
		return nil
	}
	if withDefault {
		mustExec(f, "CREATE TABLE outbox_default PARTITION OF outbox DEFAULT")
	}
	// A backlog in partitions already due: 8 to 4 widths old.
	start := time.Now()
	if err := makeParts(f.db, start.Add(-8*width), start.Add(6*width)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var rows []writtenRow
	write := func(c *pgx.Conn, n int, at string) error {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		r, err := tx.Query(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, creat_en)
			SELECT gen_random_uuid(), 'comanda', 'P-' || (g % 13), 'comanda.creada', jsonb_build_object('n', g), `+at+`
			FROM generate_series(1, $1) g RETURNING id::text, tableoid::regclass::text`, n)
		if err != nil {
			return err
		}
		type idPart struct{ ID, Part string }
		got, err := pgx.CollectRows(r, pgx.RowToStructByPos[idPart])
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		var s string
		if err := c.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
			return err
		}
		after, _ := pglogrepl.ParseLSN(s)
		mu.Lock()
		for _, g := range got {
			rows = append(rows, writtenRow{id: g.ID, part: g.Part, after: after})
		}
		mu.Unlock()
		return nil
	}
	for k := 4; k < 8; k++ {
		if err := write(f.db, 50, fmt.Sprintf("now() - interval '%d milliseconds'", (time.Duration(k)*width).Milliseconds())); err != nil {
			t.Fatal(err)
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	stopWriting := make(chan struct{})
	goLoop := func(every time.Duration, stop <-chan struct{}, step func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := step(); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(every):
				}
			}
		}()
	}
	writer, maker, watcher := connect(), connect(), connect()
	var samples []partSample
	var smu sync.Mutex
	goLoop(100*time.Millisecond, ctx.Done(), func() error {
		var c *string
		var names []string
		var size int64
		// The table locked first, as a DETACH, a CREATE TABLE ... PARTITION
		// OF and an INSERT lock it: pg_partition_tree locks the partitions,
		// then the sizes lock the table, and that order deadlocked with a
		// DETACH (the watcher stopped, and the test waited for ever) and
		// with the partition maker.
		if err := pgx.BeginFunc(ctx, watcher, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "LOCK TABLE outbox IN ACCESS SHARE MODE"); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1),
			ARRAY(SELECT relname::text FROM pg_class WHERE relname LIKE 'outbox\_p%' AND relkind = 'r'),
			(SELECT COALESCE(sum(pg_total_relation_size(relid)), 0)::bigint FROM pg_partition_tree('outbox'))`, f.name).Scan(&c, &names, &size)
		}); err != nil {
			return fmt.Errorf("the watcher: %w", err)
		}
		s := partSample{at: time.Now(), parts: map[string]bool{}, bytes: size}
		if c != nil {
			s.confirmed, _ = pglogrepl.ParseLSN(*c)
		}
		for _, n := range names {
			s.parts[n] = true
		}
		smu.Lock()
		samples = append(samples, s)
		smu.Unlock()
		return nil
	})
	// The watcher sees every partition before outboxd starts.
	eventually(t, 10*time.Second, "the watcher's first sample", func() bool { smu.Lock(); defer smu.Unlock(); return len(samples) > 0 })
	cfg := f.config(seedRoute(topic))
	cfg.Retention = map[string]string{"mode": "drop_partitions", "max_age": maxAge.String(), "interval": "1s", "confirm_timeout": "1s", "lock_timeout": "1s"}
	if marks {
		cfg.Postgres["mark_published"] = "true"
	}
	d := f.start(cfg)
	// The service: 10 rows every 50 ms, about 200 a second.
	goLoop(50*time.Millisecond, stopWriting, func() error {
		if err := write(writer, 10, "now()"); err != nil {
			return fmt.Errorf("the writer: %w", err)
		}
		return nil
	})
	// pg_partman's part: partitions six widths ahead.
	goLoop(width/2, ctx.Done(), func() error {
		if err := makeParts(maker, time.Now(), time.Now().Add(6*width)); err != nil {
			return fmt.Errorf("the partition maker: %w", err)
		}
		return nil
	})

	var stopped, restarted time.Time
	outageFor := max(2*width, 8*time.Second)
	{
		time.Sleep(run / 3)
		if err := env.StopKafka(); err != nil {
			t.Fatal(err)
		}
		stopped = time.Now()
		kafkaUp := false
		defer func() {
			if !kafkaUp {
				_ = env.StartKafka()
			}
		}()
		time.Sleep(outageFor)
		if err := env.StartKafka(); err != nil {
			t.Fatal(err)
		}
		kafkaUp = true
		restarted = time.Now()
	}
	time.Sleep(time.Until(start.Add(run)))
	close(stopWriting)
	stoppedWriting := time.Now()
	// Every partition that ended max_age (and two passes) before the last
	// write goes.
	// The slack is for a loaded machine (make matrix met 30 s short), and
	// for outboxd's reconnect backoff, which may have grown to backoff_max
	// (30 s) while Kafka was down (the writer stops after Kafka is back).
	for deadline := stoppedWriting.Add(maxAge + 2*width + 30*time.Second + 60*time.Second); ; {
		smu.Lock()
		last := samples[len(samples)-1]
		smu.Unlock()
		left := oldParts(last, stoppedWriting.Add(-maxAge-2*time.Second), width)
		if last.at.After(stoppedWriting.Add(maxAge+3*time.Second)) && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after the writer stopped, partitions past max_age left: %s", time.Since(stoppedWriting).Round(time.Second),
				dropDiagnosis(f, d.Daemon, topic, last, left, errs, rows, stopped, restarted, stoppedWriting))
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}

	// Every event delivered once (what is there after a minute is judged,
	// and so is how each partition went).
	for end := time.Now().Add(60 * time.Second); f.topicSize(topic) < int64(len(rows)) && time.Now().Before(end); {
		time.Sleep(200 * time.Millisecond)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ccancel()
	msgs, err := testenv.Consume(cctx, env.KafkaBrokers, topic, int(f.topicSize(topic)))
	if err != nil {
		t.Fatalf("consume %s: %v", topic, err)
	}
	seen := map[string]int{}
	for _, m := range msgs {
		seen[header(m, "id_esdeveniment")]++
	}
	dups, missing := 0, 0
	maxLSN := map[string]pglogrepl.LSN{}
	perPart := map[string]int{}
	for _, r := range rows {
		switch n := seen[r.id]; {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
		maxLSN[r.part] = max(maxLSN[r.part], r.after)
		perPart[r.part]++
	}
	if missing > 0 || dups > 0 || len(msgs) != len(rows) {
		t.Errorf("%d rows written, %d records in Kafka: %d missing, %d duplicates", len(rows), len(msgs), missing, dups)
	}

	// Each partition that vanished held only rows the slot had confirmed.
	var dropped []string
	droppedRows := 0
	peakDuring, peakAfter := int64(0), int64(0)
	for k := 1; k < len(samples); k++ {
		prev, cur := samples[k-1], samples[k]
		for p := range prev.parts {
			if cur.parts[p] {
				continue
			}
			dropped = append(dropped, p)
			droppedRows += perPart[p]
			if maxLSN[p] > prev.confirmed {
				t.Errorf("%s dropped at %s with a row committed before %s, while the slot had confirmed only %s", p, cur.at.Format(time.StampMilli), maxLSN[p], prev.confirmed)
			}
			if cur.at.After(stopped.Add(2*time.Second)) && cur.at.Before(restarted) {
				t.Errorf("%s dropped at %s, while Kafka was down (%s to %s)", p, cur.at.Format(time.StampMilli), stopped.Format(time.StampMilli), restarted.Format(time.StampMilli))
			}
		}
		if cur.at.After(stopped) && cur.at.Before(restarted) {
			peakDuring = max(peakDuring, cur.bytes)
		}
		if cur.at.After(stoppedWriting) {
			peakAfter = max(peakAfter, cur.bytes)
		}
	}
	sort.Strings(dropped)
	if minimum := 4 + int(run/width)/2; len(dropped) < minimum {
		t.Fatalf("only %d partitions dropped (%v), fewer than %d: the test proves little", len(dropped), dropped, minimum)
	}
	// The outbox's size: partitions present, sampled each width.
	var sizes []string
	var most int
	var next time.Time
	for _, s := range samples {
		if s.at.After(start.Add(maxAge + 2*width)) { // the backlog's partitions gone
			most = max(most, len(s.parts))
		}
		if !s.at.Before(next) {
			sizes = append(sizes, fmt.Sprintf("%s %d partitions %d kB", s.at.Sub(start).Round(time.Second), len(s.parts), s.bytes/1024))
			next = s.at.Add(width)
		}
	}
	// The outage as it was (a loaded machine restarts the broker slowly).
	if limit := int(maxAge/width) + 6 + 3 + int((restarted.Sub(stopped)+width-1)/width); most > limit {
		t.Errorf("up to %d partitions at once, more than %d (max_age's, six ahead, the one written, a pass's, the outage's): retention did not keep up", most, limit)
	}
	// Once the writer stopped and retention caught up, the outbox is back
	// under its peak during the outage (marks rewrite the rows they mark,
	// so it may grow for a while after the outage).
	if final := samples[len(samples)-1].bytes; final > peakDuring {
		t.Errorf("the outbox ends at %d kB, past its %d kB peak while Kafka was down (%d kB after the writer stopped): it is not kept flat", final/1024, peakDuring/1024, peakAfter/1024)
	}
	if withDefault {
		var n int
		if err := f.mon.QueryRow(context.Background(), "SELECT count(*) FROM pg_class WHERE relname = 'outbox_default'").Scan(&n); err != nil || n != 1 {
			t.Fatalf("the default partition is gone (%d, %v)", n, err)
		}
	}
	// The metrics against what is gone from pg_class, read after them:
	// retention goes on dropping the empty partitions made ahead as they
	// fall due, so a drop may land between the two reads (then again).
	ever := map[string]bool{}
	for _, s := range samples {
		for p := range s.parts {
			ever[p] = true
		}
	}
	var metricParts, metricRows float64
	goneParts, goneRows := 0, 0
	for try := 0; try < 10; try++ {
		metricParts = d.MetricBy(context.Background(), "outboxd_retention_partitions_dropped_total", "table", "public.outbox")
		metricRows = d.MetricBy(context.Background(), "outboxd_retention_rows_dropped_total", "table", "public.outbox")
		var names []string
		if err := f.mon.QueryRow(context.Background(), `SELECT ARRAY(SELECT relname::text FROM pg_class WHERE relname LIKE 'outbox\_p%' AND relkind = 'r')`).Scan(&names); err != nil {
			t.Fatal(err)
		}
		now := map[string]bool{}
		for _, n := range names {
			now[n] = true
		}
		goneParts, goneRows = 0, 0
		for p := range ever {
			if !now[p] {
				goneParts++
				goneRows += perPart[p]
			}
		}
		if int(metricParts) == goneParts && int(metricRows) == goneRows {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if int(metricParts) != goneParts || int(metricRows) != goneRows {
		t.Errorf("outboxd_retention_partitions_dropped_total = %v and rows_dropped_total = %v; %d partitions holding %d rows are gone", metricParts, metricRows, goneParts, goneRows)
	}
	if !strings.Contains(d.Log(), "dropped a partition whose rows Kafka has") {
		t.Errorf("no drop logged")
	}
	down := fmt.Sprintf("none while Kafka was down (%s to %s)", stopped.Sub(start).Round(time.Second), restarted.Sub(start).Round(time.Second))
	t.Logf("%d rows written over %s into %s partitions, %d delivered once each; %d partitions (%d rows) dropped, %s; at most %d partitions at once; size every width: %s",
		len(rows), run, width, len(msgs), len(dropped), droppedRows, down, most, strings.Join(sizes, "; "))
	d.term()
}

// dropDiagnosis says what a run that left old partitions looked like: the
// partitions and their rows against the slot's position, what Kafka has,
// whether a loop of the test stopped, and outboxd's last lines that are
// neither debug nor a drop (the whole log follows, but CI shows its ends).
func dropDiagnosis(f *fixture, d *testenv.Daemon, topic string, last partSample, left []string, errs chan error, rows []writtenRow,
	stopped, restarted, stoppedWriting time.Time) string {
	sort.Strings(left)
	var b strings.Builder
	fmt.Fprintf(&b, "%v at the last sample (%s, the slot at %s); Kafka stopped %s, up again %s, writer stopped %s; %d rows written, %d records in %s",
		left, last.at.Format(time.StampMilli), last.confirmed, stopped.Format(time.StampMilli), restarted.Format(time.StampMilli),
		stoppedWriting.Format(time.StampMilli), len(rows), f.topicSize(topic), topic)
	parts := map[string]bool{}
	for _, p := range left {
		parts[p] = true
	}
	n, maxAfter := map[string]int{}, map[string]pglogrepl.LSN{}
	for _, r := range rows {
		if parts[r.part] {
			n[r.part]++
			maxAfter[r.part] = max(maxAfter[r.part], r.after)
		}
	}
	for _, p := range left {
		fmt.Fprintf(&b, "; %s: %d rows, the last committed before %s", p, n[p], maxAfter[p])
	}
	select {
	case err := <-errs:
		fmt.Fprintf(&b, "; a loop of the test stopped: %v", err)
	default:
	}
	var tail []string
	for _, l := range strings.Split(d.Log(), "\n") {
		if !strings.Contains(l, "[DEBUG]") && !strings.Contains(l, "dropped a partition whose rows") {
			tail = append(tail, l)
		}
	}
	fmt.Fprintf(&b, "\noutboxd's last lines but drops and debug:\n%s", strings.Join(tail[max(0, len(tail)-25):], "\n"))
	return b.String()
}

// oldParts is the partitions of s whose range ended before cutoff, by
// their names (outbox_p<unix start>).
func oldParts(s partSample, cutoff time.Time, width time.Duration) []string {
	var out []string
	for p := range s.parts {
		sec, err := strconv.ParseInt(strings.TrimPrefix(p, "outbox_p"), 10, 64)
		if err == nil && time.Unix(sec, 0).Add(width).Before(cutoff) {
			out = append(out, p)
		}
	}
	return out
}

// dailyParts creates the outbox's daily partitions (UTC) from days from
// today to days to (exclusive), named outbox_d<YYYYMMDD>. A test reads
// today once, so that midnight does not move its partitions.
func dailyParts(f *fixture, today time.Time, from, to int) {
	f.t.Helper()
	for d := from; d < to; d++ {
		s := today.AddDate(0, 0, d)
		mustExec(f, fmt.Sprintf("CREATE TABLE outbox_d%s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')",
			s.Format("20060102"), s.Format(time.RFC3339), s.AddDate(0, 0, 1).Format(time.RFC3339)))
	}
}

// TestCheckPartitions: check's partitions and retention lines on a
// partitioned outbox with retention.mode drop_partitions: the partitions,
// publish_via_partition_root, a WARN while tomorrow's rows have no
// partition, the partitions the next pass would drop (and how, with a
// default partition), a FAIL for a role that does not own the outbox, and
// one for a table that is not partitioned.
func TestCheckPartitions(t *testing.T) {
	f := newFixture(t, dropSchema, map[string]int{"comandes": 1})
	today := time.Now().UTC().Truncate(24 * time.Hour)
	dailyParts(f, today, -5, 1)
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Retention = map[string]string{"mode": "drop_partitions", "max_age": "48h"}
	path := f.configFile(cfg)
	day := func(d int) string { return "outbox_d" + today.AddDate(0, 0, d).Format("20060102") }

	r := outboxd(t, f.dsn, "check", "-c", path)
	t.Logf("check:\n%s", r)
	if r.code != 0 {
		t.Fatalf("check: want exit 0 (WARN only)\n%s", r)
	}
	if l := r.line("WARN partitions public.outbox:"); !strings.Contains(l, "6 partition(s) by RANGE (creat_en)") || !strings.Contains(l, "in 24 hours: from then on the service's inserts fail") || !strings.Contains(l, "publish_via_partition_root") {
		t.Errorf("partitions line: %q", l)
	}
	l := r.line("PASS retention public.outbox:")
	for _, want := range []string{"drops 3 partition(s)", day(-5), day(-4), day(-3), "CONCURRENTLY"} {
		if !strings.Contains(l, want) {
			t.Errorf("retention line lacks %q: %q", want, l)
		}
	}
	if strings.Contains(l, day(-2)) {
		t.Errorf("retention line names %s, which is not due: %q", day(-2), l)
	}

	dailyParts(f, today, 1, 3)
	mustExec(f, "CREATE TABLE outbox_default PARTITION OF outbox DEFAULT")
	r = outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("PASS partitions public.outbox:"); !strings.Contains(l, "8 partition(s)") || !strings.Contains(l, "and a default one") || !strings.Contains(l, "rows created now and in 24 hours have a partition") {
		t.Errorf("partitions line with tomorrow's partition and a default one: %q\n%s", l, r)
	}
	if l := r.line("PASS retention public.outbox:"); !strings.Contains(l, "in one transaction") || !strings.Contains(l, "never the default partition") {
		t.Errorf("retention line with a default partition: %q\n%s", l, r)
	}

	role := f.name + "_notowner"
	mustExec(f, fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD 'pw-notowner-7'", role))
	mustExec(f, fmt.Sprintf("GRANT SELECT ON outbox TO %s", role))
	t.Cleanup(func() { _, _ = f.mon.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
	r = outboxd(t, roleDSN(f, role, "pw-notowner-7"), "check", "-c", path)
	wantCheckFails(t, r, "retention public.outbox", "which only public.outbox's owner", "GRANT postgres TO "+role)

	g := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	gcfg := g.config(seedRoute(g.topic("comandes")))
	gcfg.Retention = map[string]string{"mode": "drop_partitions", "max_age": "48h"}
	r = outboxd(t, g.dsn, "check", "-c", g.configFile(gcfg))
	wantCheckFails(t, r, "retention public.outbox", "is not a partitioned table", "retention.mode: delete")
}

// TestDropPartitionsBesidePartman: pg_partman creates the outbox's daily
// partitions (and its default one), outboxd drops the old ones: after the
// drops pg_partman's run_maintenance() runs cleanly and creates ahead
// again, and check warns about pg_partman's own retention once it is set.
// Debian's postgresql-15-partman is the extension (4.x); elsewhere the
// test skips, saying why.
func TestDropPartitionsBesidePartman(t *testing.T) {
	f := newFixture(t, dropSchema, map[string]int{"comandes": 1})
	if _, err := f.db.Exec(context.Background(), "CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman"); err != nil {
		t.Skipf("SKIPPED LOUDLY: pg_partman is not installed for this PostgreSQL (apt-get install postgresql-15-partman on Debian's 15): %v", err)
	}
	start := time.Now().UTC().AddDate(0, 0, -5).Format("2006-01-02")
	mustExec(f, fmt.Sprintf("SELECT partman.create_parent('public.outbox', 'creat_en', 'native', 'daily', p_premake := 2, p_start_partition := '%s')", start))
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := f.mon.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	parts := "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass"
	before := count(parts)
	var all []outboxRow
	for d := 1; d <= 5; d++ {
		all = append(all, insertRows(t, f.db, "outbox", 20, fmt.Sprintf("now() - interval '%d days'", d), false)...)
	}
	all = append(all, insertRows(t, f.db, "outbox", 20, "now()", false)...)
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.Retention = map[string]string{"mode": "drop_partitions", "max_age": "48h", "interval": "500ms", "confirm_timeout": "2s"}
	cfg.Postgres["idle_status_interval"] = "300ms"
	path := f.configFile(cfg)
	r := outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("PASS retention public.outbox:"); !strings.Contains(l, "drops 3 partition(s)") {
		t.Fatalf("check before the drops: %q\n%s", l, r)
	}
	d := f.start(cfg)
	// Partitions ending at least 48 hours ago: the ones 5, 4 and 3 days old.
	eventually(t, 60*time.Second, "the three due partitions dropped", func() bool { return count(parts) == before-3 })
	wantRecords(t, topic, ids(all))
	if n := count("SELECT count(*) FROM outbox"); n != 60 {
		t.Errorf("%d rows left, want the 60 of the last three days", n)
	}
	if _, err := f.db.Exec(context.Background(), "SELECT partman.run_maintenance('public.outbox')"); err != nil {
		t.Fatalf("pg_partman's maintenance after outboxd's drops: %v", err)
	}
	if n := count(parts); n < before-3 {
		t.Errorf("pg_partman's maintenance left %d partitions, fewer than the %d it had after the drops", n, before-3)
	}
	if n := count("SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE inhparent = 'outbox'::regclass AND c.relname LIKE '%default'"); n != 1 {
		t.Errorf("pg_partman's default partition: %d, want it kept", n)
	}
	mustExec(f, "UPDATE partman.part_config SET retention = '3 days' WHERE parent_table = 'public.outbox'")
	r = outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("WARN retention public.outbox:"); !strings.Contains(l, "pg_partman keeps public.outbox with a retention of its own (3 days)") || !strings.Contains(l, "SET retention = NULL") {
		t.Errorf("check with pg_partman's retention on: %q\n%s", l, r)
	}
	d.term()
}

// TestDropPartitionsWaitsForAReader: a transaction that reads the outbox
// (as outboxd replay does) keeps the partitions it may read: DETACH ...
// CONCURRENTLY waits for it, gives up at retention.lock_timeout and leaves
// the partition "detach pending", which the pass after the reader ends
// completes (FINALIZE) and drops; the reader meanwhile still reads the
// partition's rows. A table left detached by an earlier pass (outboxd's
// comment on it) is dropped too.
func TestDropPartitionsWaitsForAReader(t *testing.T) {
	f := newFixture(t, dropSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	dailyParts(f, today, -4, 2)
	day := func(d int) string { return "outbox_d" + today.AddDate(0, 0, d).Format("20060102") }
	old := insertRows(t, f.db, "outbox", 30, "now() - interval '4 days'", false)
	young := insertRows(t, f.db, "outbox", 30, "now()", false)
	// Left by an earlier pass: detached, commented with the fingerprint of
	// the rows the slot had confirmed, not dropped. outbox_late holds a row
	// more than its fingerprint (one went in while it was being detached):
	// it is kept, and the job says so, without holding the others back.
	mustExec(f, "CREATE TABLE outbox_left (LIKE outbox)")
	mustExec(f, `COMMENT ON TABLE outbox_left IS 'outboxd retention: detached from public.outbox once the replication slot had confirmed its rows; rows 0, id hash sum 0'`)
	mustExec(f, "CREATE TABLE outbox_late (LIKE outbox INCLUDING DEFAULTS)")
	mustExec(f, `COMMENT ON TABLE outbox_late IS 'outboxd retention: detached from public.outbox once the replication slot had confirmed its rows; rows 0, id hash sum 0'`)
	mustExec(f, "INSERT INTO outbox_late (id, agregat, agregat_id, tipus, carrega, creat_en) VALUES (gen_random_uuid(), 'comanda', 'P-1', 'comanda.creada', '{}', now() - interval '4 days')")

	tx, n := outboxReader(f)
	if n != 60 {
		t.Fatalf("the reader sees %d rows, want 60", n)
	}

	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.Retention = map[string]string{"mode": "drop_partitions", "max_age": "48h", "interval": "500ms", "confirm_timeout": "2s", "lock_timeout": "500ms"}
	// The outbox is idle: the slot passes the WAL of each drop's own
	// statements at the next standby status.
	cfg.Postgres["idle_status_interval"] = "300ms"
	d := f.start(cfg)
	exists := func(name string) bool {
		var n int
		if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = $1", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	eventually(t, 30*time.Second, "the left-over table dropped", func() bool { return !exists("outbox_left") })
	eventually(t, 30*time.Second, "a detach that gave up waiting for the reader", func() bool {
		return strings.Contains(d.Log(), "retention.lock_timeout")
	})
	// Three more seconds of passes: the reader's partitions stay.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if !exists(day(-4)) {
			t.Fatalf("%s dropped while a transaction that reads it was open", day(-4))
		}
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil || n != 60 {
		t.Fatalf("the reader sees %d rows (%v) after the passes, want 60", n, err)
	}
	var pending bool
	if err := f.mon.QueryRow(ctx, "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = $1::regclass", day(-4)).Scan(&pending); err != nil || !pending {
		t.Fatalf("%s: detach pending %v (%v), want a DETACH ... CONCURRENTLY that gave up", day(-4), pending, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{day(-4), day(-3)} {
		eventually(t, 30*time.Second, p+" dropped once the reader ended", func() bool { return !exists(p) })
	}
	if !exists(day(-2)) || !exists(day(0)) {
		t.Fatalf("a partition not due was dropped")
	}
	if !exists("outbox_late") || !strings.Contains(d.Log(), "outbox_late holds rows outboxd did not see confirmed by the slot (rows 1") {
		t.Fatalf("outbox_late, with a row its fingerprint does not count: exists %v; want it kept and the reason logged", exists("outbox_late"))
	}
	wantRecords(t, topic, ids(old, young))
	if got := d.MetricBy(ctx, "outboxd_retention_partitions_dropped_total", "table", "public.outbox"); got != 3 {
		t.Errorf("outboxd_retention_partitions_dropped_total = %v, want 3 (two partitions and the left-over table)", got)
	}
	if got := d.MetricBy(ctx, "outboxd_retention_rows_dropped_total", "table", "public.outbox"); got != 30 {
		t.Errorf("outboxd_retention_rows_dropped_total = %v, want the 30 old rows", got)
	}
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, "outboxd.retention") {
			t.Log(l)
		}
	}
	d.term()
}

// TestDropPartitionsKeptTableAdvice: a row that goes into a partition while
// the job detaches it (here while the detach waits for a reader) keeps the
// detached table, and the SQL the job logs for it works on an outbox
// without a default partition, where INSERT INTO outbox SELECT * FROM the
// table alone finds no partition for its rows: run as logged, in one
// transaction, it puts the table's rows back into the outbox and drops
// the table; the stream publishes them, the late row included, and the
// job then drops their new partition like any other.
func TestDropPartitionsKeptTableAdvice(t *testing.T) {
	f := newFixture(t, dropSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	dailyParts(f, today, -4, 2)
	part := "outbox_d" + today.AddDate(0, 0, -4).Format("20060102")
	old := insertRows(t, f.db, "outbox", 10, "now() - interval '4 days'", false)

	tx, _ := outboxReader(f)

	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.Retention = map[string]string{"mode": "drop_partitions", "max_age": "48h", "interval": "500ms", "confirm_timeout": "2s", "lock_timeout": "500ms"}
	cfg.Postgres["idle_status_interval"] = "300ms"
	d := f.start(cfg)
	eventually(t, 30*time.Second, part+" detach pending (its DETACH ... CONCURRENTLY waits for the reader)", func() bool {
		var pending bool
		err := f.mon.QueryRow(ctx, "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)", part).Scan(&pending)
		return err == nil && pending
	})
	late := insertRows(t, f.db, part, 1, "now() - interval '4 days'", false)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	const kept = " holds rows outboxd did not see confirmed by the slot"
	eventually(t, 30*time.Second, part+" kept for its late row", func() bool { return strings.Contains(d.Log(), part+kept) })
	var line string
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, part+kept) {
			line = strings.ReplaceAll(l, `\"`, `"`) // the log quotes the error
		}
	}
	begin, commit := strings.Index(line, "BEGIN; "), strings.Index(line, " COMMIT;")
	if begin < 0 || commit < begin {
		t.Fatalf("the job's advice for %s is no BEGIN; ... COMMIT; to run:\n%s", part, line)
	}
	advice := line[begin+len("BEGIN; ") : commit]
	t.Logf("the job's advice: %s", advice)
	before := recordsOf(t, topic, late[0].id)

	all := ids(old, late)
	var n int
	atx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = atx.Rollback(ctx) }()
	if _, err := atx.Exec(ctx, advice); err != nil {
		t.Fatalf("the job's advice fails: %v\n%s", err, advice)
	}
	if err := atx.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id::text = ANY($1)", all).Scan(&n); err != nil || n != len(all) {
		t.Fatalf("after the advice the outbox holds %d of the kept table's %d rows (%v)", n, len(all), err)
	}
	if err := atx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := f.mon.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = $1", part).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%s still there after the advice (%d, %v)", part, left, err)
	}
	eventually(t, 30*time.Second, "the late row published by the advice", func() bool { return recordsOf(t, topic, late[0].id) == before+1 })
	eventually(t, 30*time.Second, "the partition the advice made dropped by the job", func() bool {
		var m int
		err := f.mon.QueryRow(ctx, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass AND inhrelid::regclass::text LIKE $1", part+"%").Scan(&m)
		return err == nil && m == 0
	})
	d.term()
}

// outboxReader opens a transaction that has read the outbox, as outboxd
// replay does (REPEATABLE READ READ ONLY), and the rows it saw; the test's
// end closes it.
func outboxReader(f *fixture) (pgx.Tx, int) {
	f.t.Helper()
	ctx := context.Background()
	reader, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { reader.Close(ctx) })
	tx, err := reader.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		f.t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return tx, n
}

// recordsOf counts the records of event id in topic.
func recordsOf(t *testing.T, topic, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	all, _ := testenv.Consume(ctx, env.KafkaBrokers, topic, 0)
	n := 0
	for _, m := range all {
		if header(m, "id_esdeveniment") == id {
			n++
		}
	}
	return n
}
