package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// partitionedSchema is the contract's outbox partitioned by RANGE
// (creat_en) with no partition yet (the bench makes them, as pg_partman
// would): the primary key holds the partition key; the relay's index.
const partitionedSchema = testenv.PartitionedOutbox + `
CREATE INDEX outbox_pendents ON outbox (creat_en) WHERE publicat_en IS NULL;`

// insertSQL writes $2 rows numbered from $1: ~300 bytes of carrega each
// (an order of three lines), 50,000 aggregates.
const insertSQL = `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega)
SELECT gen_random_uuid(), 'comanda', 'P-2026-' || lpad((n % 50000)::text, 6, '0'), 'comanda.creada',
  jsonb_build_object('id', 'P-2026-' || lpad((n % 1000000)::text, 6, '0'), 'client', 'C-' || (n % 977), 'mercat', 'mercat-del-ter', 'estat', 'creada',
    'linies', jsonb_build_array(
      jsonb_build_object('producte', 'formatge-curat', 'quantitat', 1 + n % 3, 'preu_centims', 1450),
      jsonb_build_object('producte', 'mel-de-romani', 'quantitat', 1 + n % 2, 'preu_centims', 890),
      jsonb_build_object('producte', 'oli-arbequina', 'quantitat', 1 + n % 4, 'preu_centims', 1275)))
FROM generate_series($1::bigint, $1::bigint + $2 - 1) n`

// outboxRels is the outbox and its partitions (pg_partition_tree has no
// row for a plain table).
const outboxRels = `(SELECT 'outbox'::regclass AS relid UNION SELECT relid FROM pg_partition_tree('outbox'))`

// outboxStats is the outbox's total size and dead tuples, its partitions
// included.
const outboxStats = `(SELECT COALESCE(sum(pg_total_relation_size(relid)), 0) FROM ` + outboxRels + ` r)::bigint,
	(SELECT COALESCE(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM ` + outboxRels + ` r))::bigint`

// result is what one workload measured; the day's figures are over the
// second day.
type result struct {
	w                  workload
	rate               float64 // rows/s the writer achieved over the two days
	written            int64   // rows, the whole run
	topicRecords       int64
	dayEvents          int64 // rows committed in the measured day
	walBytes           int64
	walRecords, walFPI int64
	sizeStart, sizeEnd int64
	sizePeak           int64
	deadEnd, deadPeak  int64
	vacuums            int64 // autovacuum_count + vacuum_count, the outbox and its partitions
	liveEnd            int64
	oldestEnd          time.Duration
	partsEnd           int
	sizes              []int64 // at hour 0, 4, 8... 48
	outboxVacuum       vacuumLog
	otherVacuum        vacuumLog // the database's other tables: the catalogs
	logRead            bool      // the server log was read
	retention          retentionLog
	wal                map[string]walKind // by walKinds' names; nil: pg_waldump failed
}

// snapshot is the server at one moment.
type snapshot struct {
	at                 time.Time
	written            int64
	lsn                string
	walRecords, walFPI int64
	size, dead         int64
	logOffset          int64 // the server log's size
}

// sample is what the sampler saw at one moment.
type sample struct {
	at         time.Time
	size, dead int64
	vacuums    map[int64]int64 // per relation of the outbox
}

// measure runs one workload for two days and measures the second.
func (b *bench) measure(ctx context.Context, w workload) (*result, error) {
	name := "rb_" + strings.ReplaceAll(w.key, "-", "_") + "_" + b.tag
	schema, pubWith := partitionedSchema, "publish = 'insert', publish_via_partition_root = true"
	if !w.partitioned {
		seed, err := testenv.SeedSchema()
		if err != nil {
			return nil, err
		}
		schema, pubWith = seed+"\nCREATE INDEX outbox_creat_en ON outbox (creat_en);", "publish = 'insert'"
	}
	_, _ = b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	dsn, err := b.env.CreateDatabase(name, schema+"\nCREATE PUBLICATION "+name+" FOR TABLE outbox WITH ("+pubWith+");")
	if err != nil {
		return nil, err
	}
	defer b.dropRun(name)
	if err := b.env.CreateTopic(name, b.o.partitions); err != nil {
		return nil, err
	}
	conns := map[string]*pgx.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	for _, c := range []string{"mon", "sampler", "maker", "checkpointer"} {
		if conns[c], err = pgx.Connect(ctx, dsn); err != nil {
			return nil, err
		}
	}
	maker := &partitionMaker{conn: conns["maker"], hour: b.o.hour, ahead: time.Duration(b.o.premake) * b.o.hour, made: map[time.Time]bool{}}
	if w.partitioned {
		if err := maker.make(ctx); err != nil {
			return nil, err
		}
	}

	d, err := testenv.StartDaemon(b.logDir, testenv.Config{
		DSN: dsn, Brokers: b.env.KafkaBrokers, Slot: name,
		Routes:    []testenv.Route{{Table: "public.outbox", Topic: name}},
		Postgres:  testenv.Section{"publication": name, "create_publication": "false"},
		Retention: b.retention(w),
		Log:       testenv.Section{"level": "info", "format": "json"},
		Bin:       b.o.binary,
	})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if err := d.WaitReady(ctx, 60*time.Second); err != nil {
		return nil, err
	}

	// The writers, the sampler, the partition maker and the checkpoints run
	// until the run ends; the writers stop first, at the end of the day.
	bg, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, b.o.writers+3)
	goLoop := func(what string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(bg); err != nil && bg.Err() == nil {
				errs <- fmt.Errorf("%s: %w", what, err)
			}
		}()
	}
	stopAll := func() {
		cancel()
		wg.Wait()
	}
	// The writers finish their transaction when told to stop: a commit
	// cancelled half-way might be in the topic but not counted.
	var written atomic.Int64
	stopping := make(chan struct{})
	var stopOnce sync.Once
	stopWriting := func() { stopOnce.Do(func() { close(stopping) }) }
	var writers sync.WaitGroup
	defer func() {
		stopWriting()
		stopAll()
		writers.Wait()
	}()
	t0 := time.Now()
	every := time.Duration(float64(time.Second) * float64(b.o.txn*b.o.writers) / float64(b.o.rate))
	for i := range b.o.writers {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return nil, err
		}
		conns[fmt.Sprintf("writer%d", i)] = c
		writers.Add(1)
		go func() {
			defer writers.Done()
			if err := b.write(bg, stopping, c, int64(i)<<40, t0, every, &written); err != nil && bg.Err() == nil {
				errs <- fmt.Errorf("writer: %w", err)
			}
		}()
	}
	samples := &sampler{conn: conns["sampler"]}
	goLoop("sampler", samples.run)
	if w.partitioned {
		goLoop("partition maker", func(ctx context.Context) error { return repeat(ctx, b.o.hour/2, maker.make) })
	}
	if b.o.checkpoint > 0 {
		goLoop("checkpoint", func(ctx context.Context) error {
			return repeat(ctx, b.o.checkpoint, func(ctx context.Context) error {
				_, err := conns["checkpointer"].Exec(ctx, "CHECKPOINT")
				return err
			})
		})
	}

	// The measured day.
	var s1, s2 snapshot
	for i, at := range []time.Time{t0.Add(b.o.day()), t0.Add(2 * b.o.day())} {
		select {
		case err := <-errs:
			stopWriting()
			writers.Wait()
			return nil, err
		case <-ctx.Done():
			stopWriting()
			writers.Wait()
			return nil, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		if i == 0 {
			// The day's WAL stays on disk for pg_waldump (dropRun drops the slot).
			if _, err := b.admin.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", holdSlot(name)); err != nil {
				return nil, err
			}
		}
		s, err := b.snapshot(ctx, conns["mon"], &written)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			s1 = s
			logf(b.log, "%s: day 2 begins: %d rows written, outbox %.1f MiB", w.key, s.written, mib(s.size))
		} else {
			s2 = s
		}
	}
	r := &result{w: w, dayEvents: s2.written - s1.written, walRecords: s2.walRecords - s1.walRecords, walFPI: s2.walFPI - s1.walFPI,
		sizeStart: s1.size, sizeEnd: s2.size, sizePeak: max(s1.size, s2.size), deadEnd: s2.dead, deadPeak: max(s1.dead, s2.dead)}
	mon := conns["mon"]
	var oldest float64
	if err := mon.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint, (SELECT count(*) FROM outbox),
		(SELECT COALESCE(extract(epoch FROM now() - min(creat_en)), 0)::float8 FROM outbox),
		(SELECT count(*) FROM pg_partition_tree('outbox') WHERE isleaf AND level > 0)`, s2.lsn, s1.lsn).
		Scan(&r.walBytes, &r.liveEnd, &oldest, &r.partsEnd); err != nil {
		return nil, err
	}
	r.oldestEnd = time.Duration(oldest * float64(time.Second))
	stopWriting()
	writers.Wait()
	r.written = written.Load()
	r.rate = float64(r.written) / time.Since(t0).Seconds()
	logf(b.log, "%s: day 2 ends: %d rows in the day, WAL %.1f MiB, outbox %.1f MiB", w.key, r.dayEvents, mib(r.walBytes), mib(r.sizeEnd))

	// Everything written is in the topic, once.
	deadline := time.Now().Add(2 * time.Minute)
	for r.topicRecords, err = b.topicSize(ctx, name); r.topicRecords < r.written && time.Now().Before(deadline); r.topicRecords, err = b.topicSize(ctx, name) {
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("count the records of %s: %w", name, err)
	}
	stopAll()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	if err := d.Term(60 * time.Second); err != nil {
		return nil, fmt.Errorf("outboxd's exit: %w (log %s)", err, d.LogPath())
	}

	samples.summarize(r, s1, s2, t0, t0.Add(2*b.o.day()), 4*b.o.hour)
	r.retention, err = readRetentionLog(d.LogPath(), s1.at, s2.at)
	if err != nil {
		return nil, err
	}
	for _, l := range r.retention.trouble {
		logf(b.log, "%s: outboxd: %s", w.key, l)
	}
	r.outboxVacuum, r.otherVacuum, r.logRead = b.readVacuumLog(name, s1.logOffset, s2.logOffset)
	if r.wal, err = b.walStats(w, s1.lsn, s2.lsn); err != nil {
		logf(b.log, "%s: the WAL by record type: %v", w.key, err)
	}
	return r, nil
}

// retention is outboxd's retention section for w: max_age one day, a pass
// every half hour, at most an hour's wait for the slot.
func (b *bench) retention(w workload) testenv.Section {
	if w.mode == "" {
		return nil
	}
	s := testenv.Section{"mode": w.mode, "max_age": b.o.day().String(), "interval": (b.o.hour / 2).String(), "confirm_timeout": b.o.hour.String()}
	if w.mode == "delete" {
		s["batch_size"] = "1000"
	} else {
		s["lock_timeout"] = "2s"
	}
	return s
}

// write inserts txn rows every `every` from start (catching up when late)
// until stop closes, numbering them from first; written counts the
// committed rows.
func (b *bench) write(ctx context.Context, stop <-chan struct{}, c *pgx.Conn, first int64, start time.Time, every time.Duration, written *atomic.Int64) error {
	next := start
	for n := first; ; n += int64(b.o.txn) {
		if _, err := c.Exec(ctx, insertSQL, n, b.o.txn); err != nil {
			return err
		}
		written.Add(int64(b.o.txn))
		next = next.Add(every)
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(next)):
		}
	}
}

// repeat runs f at once and then every d until ctx ends or f fails.
func repeat(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if err := f(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// partitionMaker makes the outbox's one-hour partitions from the current
// hour to `ahead` from now, as pg_partman's premake does.
type partitionMaker struct {
	conn        *pgx.Conn
	hour, ahead time.Duration
	made        map[time.Time]bool
}

func (m *partitionMaker) make(ctx context.Context) error {
	now := time.Now()
	for s := now.Truncate(m.hour); s.Before(now.Add(m.ahead)); s = s.Add(m.hour) {
		if m.made[s] {
			continue
		}
		if _, err := m.conn.Exec(ctx, fmt.Sprintf("CREATE TABLE outbox_p%d PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')",
			s.UnixMilli(), s.UTC().Format(time.RFC3339Nano), s.Add(m.hour).UTC().Format(time.RFC3339Nano))); err != nil {
			return err
		}
		m.made[s] = true
	}
	return nil
}

// snapshot reads the WAL position and counters, the outbox's size and dead
// tuples, and the server log's size.
func (b *bench) snapshot(ctx context.Context, c *pgx.Conn, written *atomic.Int64) (snapshot, error) {
	s := snapshot{written: written.Load()}
	err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, wal_records, wal_fpi, `+outboxStats+` FROM pg_stat_wal`).
		Scan(&s.lsn, &s.walRecords, &s.walFPI, &s.size, &s.dead)
	s.at = time.Now()
	if fi, serr := os.Stat(b.serverLog()); serr == nil {
		s.logOffset = fi.Size()
	}
	return s, err
}

// sampler reads the outbox's size, dead tuples and vacuum counts every
// 250 ms.
type sampler struct {
	conn    *pgx.Conn
	mu      sync.Mutex
	samples []sample
}

func (s *sampler) run(ctx context.Context) error {
	return repeat(ctx, 250*time.Millisecond, func(ctx context.Context) error {
		smp := sample{vacuums: map[int64]int64{}}
		var rels, counts []int64
		err := s.conn.QueryRow(ctx, `SELECT `+outboxStats+`,
			ARRAY(SELECT relid::bigint FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM `+outboxRels+` r) ORDER BY relid),
			ARRAY(SELECT autovacuum_count + vacuum_count FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM `+outboxRels+` r) ORDER BY relid)`).
			Scan(&smp.size, &smp.dead, &rels, &counts)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		smp.at = time.Now()
		for i := range min(len(rels), len(counts)) {
			smp.vacuums[rels[i]] = counts[i]
		}
		s.mu.Lock()
		s.samples = append(s.samples, smp)
		s.mu.Unlock()
		return nil
	})
}

// summarize puts the peaks over [s1, s2], the vacuums counted then and the
// size every step from t0 to end into r. A relation's vacuums are its last
// count in the day minus its count at the day's start (0 for a partition
// made during the day); a partition dropped keeps what was last seen.
func (s *sampler) summarize(r *result, s1, s2 snapshot, t0, end time.Time, step time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	base, last := map[int64]int64{}, map[int64]int64{}
	for _, smp := range s.samples {
		if !smp.at.After(s1.at) {
			for rel, n := range smp.vacuums {
				base[rel] = n
			}
			continue
		}
		if smp.at.After(s2.at) {
			continue
		}
		r.sizePeak, r.deadPeak = max(r.sizePeak, smp.size), max(r.deadPeak, smp.dead)
		for rel, n := range smp.vacuums {
			last[rel] = n
		}
	}
	for rel, n := range last {
		r.vacuums += n - base[rel]
	}
	for at := t0; !at.After(end); at = at.Add(step) {
		best, size := time.Duration(1<<62), int64(-1)
		for _, smp := range s.samples {
			if d := smp.at.Sub(at).Abs(); d < best {
				best, size = d, smp.size
			}
		}
		r.sizes = append(r.sizes, size)
	}
}

// topicSize is the records in topic (a fresh topic: the sum of the
// partitions' end offsets).
func (b *bench) topicSize(ctx context.Context, topic string) (int64, error) {
	reqs := make([]kafka.OffsetRequest, b.o.partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	client := &kafka.Client{Addr: kafka.TCP(b.env.KafkaBrokers), Timeout: 10 * time.Second}
	resp, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return 0, po.Error
		}
		sum += po.LastOffset
	}
	return sum, nil
}

// dropRun removes a run's slot, database and topic.
func (b *bench) dropRun(name string) {
	ctx := context.Background()
	if _, err := b.admin.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ($1, $2) AND NOT active", name, holdSlot(name)); err != nil {
		logf(b.log, "drop slot %s: %v", name, err)
	}
	if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		logf(b.log, "drop database %s: %v", name, err)
	}
	if err := testenv.DeleteTopics(ctx, b.env.KafkaBrokers, name); err != nil {
		logf(b.log, "delete topic %s: %v", name, err)
	}
}

// retentionLog is what outboxd's retention job logged in the day.
type retentionLog struct {
	deletes, rowsDeleted int64 // "deleted old rows" lines and their rows
	drops, rowsDropped   int64 // "dropped a partition" lines and their rows
	waits                int64 // "nothing deleted for now"
	trouble              []string
}

// readRetentionLog reads outboxd's JSON log: the retention lines between
// from and to, and every warning or error of the run.
func readRetentionLog(path string, from, to time.Time) (retentionLog, error) {
	var rl retentionLog
	f, err := os.Open(path)
	if err != nil {
		return rl, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			Level   string  `json:"@level"`
			Message string  `json:"@message"`
			At      string  `json:"@timestamp"`
			Rows    float64 `json:"rows"`
			Error   string  `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue // testenv's own lines
		}
		if l.Level == "warn" || l.Level == "error" {
			rl.trouble = append(rl.trouble, fmt.Sprintf("%s %s: %s %s", l.At, l.Level, l.Message, l.Error))
		}
		at, err := time.Parse(time.RFC3339Nano, l.At)
		if err != nil || at.Before(from) || at.After(to) {
			continue
		}
		switch l.Message {
		case "retention: deleted old rows":
			rl.deletes++
			rl.rowsDeleted += int64(l.Rows)
		case "retention: dropped a partition whose rows Kafka has":
			rl.drops++
			rl.rowsDropped += int64(l.Rows)
		case "retention: nothing deleted for now":
			rl.waits++
		}
	}
	return rl, sc.Err()
}

// vacuumLog sums the autovacuums the server logged.
type vacuumLog struct {
	runs, walBytes int64
}

var (
	vacuumStart = regexp.MustCompile(`LOG:  automatic (?:aggressive )?vacuum (?:to prevent wraparound )?of table "([^"]+)"`)
	walLine     = regexp.MustCompile(`WAL usage: \d+ records, \d+ full page images, (\d+) bytes`)
)

func (b *bench) serverLog() string { return filepath.Join(b.env.Dir, "pg", "server.log") }

// readVacuumLog reads the autovacuums the server log holds between two
// offsets, of database db: the outbox's (the table or its partitions) and
// the others' (the catalogs). ok is false when the log cannot be read.
func (b *bench) readVacuumLog(db string, from, to int64) (outbox, other vacuumLog, ok bool) {
	f, err := os.Open(b.serverLog())
	if err != nil || to <= from {
		return outbox, other, false
	}
	defer f.Close()
	buf := make([]byte, to-from)
	if _, err := f.ReadAt(buf, from); err != nil && !errors.Is(err, io.EOF) {
		return outbox, other, false
	}
	var cur *vacuumLog
	for _, line := range bytes.Split(buf, []byte("\n")) {
		if len(line) > 0 && line[0] != '\t' {
			cur = nil // a new message
			m := vacuumStart.FindSubmatch(line)
			if m == nil {
				continue
			}
			table, found := strings.CutPrefix(string(m[1]), db+".")
			if !found {
				continue
			}
			cur = &other
			if table == "public.outbox" || strings.HasPrefix(table, "public.outbox_p") {
				cur = &outbox
			}
			cur.runs++
			continue
		}
		if cur == nil {
			continue
		}
		if m := walLine.FindSubmatch(line); m != nil {
			cur.walBytes += atoi(m[1])
		}
	}
	return outbox, other, true
}

func atoi(b []byte) int64 {
	n, _ := strconv.ParseInt(string(b), 10, 64)
	return n
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// holdSlot is the physical slot that keeps a run's measured WAL.
func holdSlot(name string) string { return name + "_hold" }

// walKind is WAL of some record types: the records' bytes and the
// full-page images they carry.
type walKind struct{ records, fpi int64 }

// walKinds sorts pg_waldump's record types (rmgr/info) into what wrote
// them; a type matched by none is "other".
var walKinds = []struct {
	name  string
	match func(typ string) bool
}{
	{"heap and index inserts", func(t string) bool {
		return strings.HasPrefix(t, "Heap/INSERT") || strings.HasPrefix(t, "Heap2/MULTI_INSERT") ||
			strings.HasPrefix(t, "Btree/INSERT") || strings.HasPrefix(t, "Btree/SPLIT") || t == "Btree/NEWROOT" || t == "Btree/DEDUP"
	}},
	{"heap DELETE", func(t string) bool { return t == "Heap/DELETE" }},
	{"pruning and vacuum", func(t string) bool {
		switch t {
		case "Heap2/PRUNE", "Heap2/VACUUM", "Heap2/VISIBLE", "Heap2/FREEZE_PAGE", "Btree/VACUUM", "Btree/DELETE",
			"Btree/MARK_PAGE_HALFDEAD", "Btree/UNLINK_PAGE", "Btree/UNLINK_PAGE_META", "Btree/REUSE_PAGE", "Btree/META_CLEANUP":
			return true
		}
		return false
	}},
	{"commits", func(t string) bool { return strings.HasPrefix(t, "Transaction/") }},
	{"other (catalogs, files, checkpoints, locks)", func(string) bool { return true }},
}

// walStats is pg_waldump --stats=record over [from, to), by walKinds; the
// whole output goes to the out folder.
func (b *bench) walStats(w workload, from, to string) (map[string]walKind, error) {
	out, err := exec.Command(pgBin("pg_waldump"), "--stats=record", "-p", filepath.Join(b.env.Dir, "pg", "pg_wal"), "-s", from, "-e", to).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pg_waldump: %w\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(b.o.out, "waldump-"+w.key+".txt"), out, 0o644); err != nil {
		return nil, err
	}
	kinds := map[string]walKind{}
	for _, line := range strings.Split(string(out), "\n") {
		// Type N (%) Record size (%) FPI size (%) Combined size (%)
		f := strings.Fields(strings.NewReplacer("(", " ", ")", " ").Replace(line))
		if len(f) != 9 || !strings.Contains(f[0], "/") {
			continue
		}
		rec, err1 := strconv.ParseInt(f[3], 10, 64)
		fpi, err2 := strconv.ParseInt(f[5], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		for _, k := range walKinds {
			if k.match(f[0]) {
				sum := kinds[k.name]
				kinds[k.name] = walKind{records: sum.records + rec, fpi: sum.fpi + fpi}
				break
			}
		}
	}
	if len(kinds) == 0 {
		return nil, fmt.Errorf("pg_waldump printed no record type:\n%s", out)
	}
	return kinds, nil
}

// pgBin is a PostgreSQL program of the server's version: pg_config's
// bindir, else the newest Debian one.
func pgBin(name string) string {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(m) > 0 {
		return m[len(m)-1]
	}
	return name
}
