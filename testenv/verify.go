package testenv

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// Verifier reads a topic from the beginning, while outboxd runs or after,
// and holds what it read against what was committed (Final): every
// committed row delivered, nothing else, a duplicate identical to the first
// delivery (partition, key, headers, value), for each aggregate the first
// deliveries in commit order, and each record as Check wants it. With DSN
// and Slot set it also samples the slot's confirmed position every 100 ms,
// to tell whether outboxd ever confirmed what Kafka did not hold yet.
type Verifier struct {
	Brokers    string // a listener the verifier reads from
	Topic      string
	Partitions int
	// Check, when set, judges each record (its envelope, its partition...);
	// an error counts it as a bad record. It runs on the readers' goroutines.
	Check     func(m kafka.Message) error
	DSN, Slot string
	// History keeps every record read (not only the first of each id),
	// for Records(key): a test's diagnostics of an order error.
	History bool

	mu         sync.Mutex
	history    map[string][]string // key -> records read, in reading order
	first      map[string]delivery
	dups       int
	dupDiffers []string
	badRecords []string
	offsets    map[int]int64 // next offset to read, per partition
	samples    []sample
	seen       atomic.Int64

	watermarks *watermarks

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Event is one committed outbox row, as the Verifier needs it.
type Event struct {
	Key, Tipus string
	// Pos is the row's place in its aggregate's commit order, from 1; 0
	// leaves the row out of the order check.
	Pos int64
}

// Txn is one committed transaction, as its writer saw it.
type Txn struct {
	// U is pg_current_wal_lsn() read on the writer's connection right after
	// COMMIT returned: an upper bound of the commit record's end. 0 when it
	// could not be read.
	U   pglogrepl.LSN
	At  time.Time // when COMMIT returned
	IDs []string
}

// delivery is the first record read for one id.
type delivery struct {
	partition  int
	offset     int64
	key, tipus string
	hash       uint64 // of key, headers and value
}

// sample is one read of the slot's confirmed_flush_lsn followed by one read
// of every partition's high watermark.
type sample struct {
	at        time.Time
	confirmed pglogrepl.LSN
	hw        map[int]int64
}

// Start begins reading (and sampling).
func (v *Verifier) Start(ctx context.Context) {
	v.first = map[string]delivery{}
	v.offsets = map[int]int64{}
	v.watermarks = newWatermarks(splitBrokers(v.Brokers))
	// Below a partition's log start retention deleted the records: it is
	// read from there (CaughtUp).
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if start, _, err := LogOffsets(lctx, v.Brokers, v.Topic, v.Partitions); err == nil {
		maps.Copy(v.offsets, start)
	}
	cancel()
	ctx, v.cancel = context.WithCancel(ctx)
	for p := 0; p < v.Partitions; p++ {
		v.wg.Add(1)
		go v.read(ctx, p)
	}
	if v.Slot != "" {
		v.wg.Add(1)
		go v.sampleLoop(ctx)
	}
}

// Stop ends reading and sampling.
func (v *Verifier) Stop() {
	v.cancel()
	v.wg.Wait()
	v.watermarks.close() // CaughtUp after Stop opens them again, closed by the next Stop
}

func (v *Verifier) read(ctx context.Context, p int) {
	defer v.wg.Done()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: splitBrokers(v.Brokers), Topic: v.Topic, Partition: p,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond,
		ReadBackoffMin: 50 * time.Millisecond, ReadBackoffMax: 500 * time.Millisecond,
	})
	defer r.Close()
	_ = r.SetOffset(kafka.FirstOffset)
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		v.record(m)
	}
}

func (v *Verifier) record(m kafka.Message) {
	h := fnv.New64a()
	h.Write(m.Key)
	h.Write([]byte{0})
	var id, tipus, commitLSN, txnIndex string
	for _, hd := range m.Headers {
		if hd.Key == "outboxd.stream" {
			// sink.HeaderStream says where a streamed copy came from;
			// the copy replay or a cut-over snapshot writes of the same
			// row has none: it is the same event.
			continue
		}
		h.Write([]byte(hd.Key))
		h.Write([]byte{0})
		h.Write(hd.Value)
		h.Write([]byte{0})
		switch hd.Key {
		case "id_esdeveniment":
			id = string(hd.Value)
		case "tipus":
			tipus = string(hd.Value)
		case "outboxd.commit_lsn":
			commitLSN = string(hd.Value)
		case "outboxd.txn_index":
			txnIndex = string(hd.Value)
		}
	}
	h.Write(m.Value)
	var bad error
	if id == "" {
		bad = errors.New("no id_esdeveniment header")
	} else if v.Check != nil {
		bad = v.Check(m)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.offsets[m.Partition] = m.Offset + 1
	if v.History {
		if v.history == nil {
			v.history = map[string][]string{}
		}
		src := "table (no commit_lsn)"
		if commitLSN != "" {
			src = "commit_lsn " + commitLSN + " index " + txnIndex
		}
		v.history[string(m.Key)] = append(v.history[string(m.Key)], fmt.Sprintf("%d@%d id %s %s, appended %s", m.Partition, m.Offset, id, src, m.Time.Format("15:04:05.000000")))
	}
	if bad != nil {
		v.badRecords = append(v.badRecords, fmt.Sprintf("%d@%d (id %q): %v", m.Partition, m.Offset, id, bad))
		if id == "" {
			return
		}
	}
	d := delivery{partition: m.Partition, offset: m.Offset, key: string(m.Key), tipus: tipus, hash: h.Sum64()}
	if prev, ok := v.first[id]; ok {
		v.dups++
		if prev.hash != d.hash || prev.partition != d.partition {
			v.dupDiffers = append(v.dupDiffers, fmt.Sprintf("%s: %d@%d and %d@%d differ", id, prev.partition, prev.offset, d.partition, d.offset))
		}
		return
	}
	v.first[id] = d
	v.seen.Add(1)
}

// Records is every record read with key (Verifier.History), in reading
// order: partition@offset, id, where it came from.
func (v *Verifier) Records(key string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.history[key]...)
}

// Dups is how many duplicate records were read so far.
func (v *Verifier) Dups() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.dups
}

// Distinct is how many distinct ids were delivered so far.
func (v *Verifier) Distinct() int64 { return v.seen.Load() }

// WaitSeen waits until every id was delivered and returns when the last one
// was seen, or an error after timeout.
func (v *Verifier) WaitSeen(ctx context.Context, ids []string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	i := 0
	for {
		v.mu.Lock()
		for i < len(ids) {
			if _, ok := v.first[ids[i]]; !ok {
				break
			}
			i++
		}
		v.mu.Unlock()
		if i == len(ids) {
			return time.Now(), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("after %s, %d of %d records of %s still not delivered (e.g. id %s)", timeout, len(ids)-i, len(ids), v.Topic, ids[i])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CaughtUp waits until every partition was read up to the high watermark
// it has now: any duplicate already in Kafka has then been read.
func (v *Verifier) CaughtUp(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var hw map[int]int64
	for {
		var err error
		if hw, err = v.highWatermarks(ctx, 5*time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("read high watermarks: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for {
		v.mu.Lock()
		done := true
		for p, h := range hw {
			if v.offsets[p] < h {
				done = false
			}
		}
		v.mu.Unlock()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the verifier did not read up to the high watermarks %v of %s within %s", hw, v.Topic, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (v *Verifier) highWatermarks(ctx context.Context, timeout time.Duration) (map[int]int64, error) {
	return v.watermarks.read(ctx, v.Topic, v.Partitions, timeout)
}

func (v *Verifier) sampleLoop(ctx context.Context) {
	defer v.wg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := pgx.Connect(cctx, v.DSN)
			cancel()
			if err != nil {
				continue
			}
			conn = c
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var c *string
		err := conn.QueryRow(qctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", v.Slot).Scan(&c)
		cancel()
		if err != nil {
			if !errors.Is(err, pgx.ErrNoRows) {
				conn.Close(context.Background())
				conn = nil
			}
			continue
		}
		if c == nil {
			continue
		}
		confirmed, err := pglogrepl.ParseLSN(*c)
		if err != nil {
			continue
		}
		// The high watermarks are read AFTER the confirmed position: anything
		// Kafka acknowledged before outboxd confirmed is below them.
		hw, err := v.highWatermarks(ctx, 2*time.Second)
		if err != nil {
			continue
		}
		v.mu.Lock()
		v.samples = append(v.samples, sample{at: time.Now(), confirmed: confirmed, hw: hw})
		v.mu.Unlock()
	}
}

// Report is what the Verifier found.
type Report struct {
	Rows          int // committed rows
	Delivered     int // records read, duplicates included
	Distinct      int // committed rows delivered
	Lost          int
	Duplicates    int
	DupDiffer     int
	OrderErrors   int
	BadRecords    int
	Unknown       int // records whose id was not committed
	Mismatch      int // records whose key or tipus differ from the row's
	LSNViolations int // confirmed_flush_lsn passed a record Kafka did not hold yet
	// Moved counts the aggregates whose first deliveries are in more than
	// one partition (partitions added mid-stream); the order check then
	// holds only where the partitions' order is the move's (murmur2 over a
	// doubled count moves a key from p to p or p+n).
	Moved    int
	Samples  int
	Checked  int // transactions covered by a sample
	Examples []string
	LostIDs  []string // every lost row's id
	// OrderKeys is the aggregates with an order error.
	OrderKeys []string
}

// String is the counts, without the examples.
func (r Report) String() string {
	s := fmt.Sprintf("%d rows, %d records read (%d distinct, %d duplicates), lost %d, unknown %d, mismatched %d, bad %d, duplicates differing %d, order errors %d",
		r.Rows, r.Delivered, r.Distinct, r.Duplicates, r.Lost, r.Unknown, r.Mismatch, r.BadRecords, r.DupDiffer, r.OrderErrors)
	if r.Samples > 0 {
		s += fmt.Sprintf(", %d slot samples covering %d transactions, %d confirmed before Kafka held them", r.Samples, r.Checked, r.LSNViolations)
	}
	return s
}

// OK is true when nothing is wrong.
func (r Report) OK() bool {
	return r.Lost == 0 && r.DupDiffer == 0 && r.OrderErrors == 0 && r.BadRecords == 0 && r.Unknown == 0 && r.Mismatch == 0 && r.LSNViolations == 0
}

func (r *Report) example(format string, args ...any) {
	if len(r.Examples) < 8 {
		r.Examples = append(r.Examples, fmt.Sprintf(format, args...))
	}
}

// Final compares what was read with the committed rows, by id, and the slot
// samples with the transactions' commit positions (txns may be nil). Call
// it after Stop.
func (v *Verifier) Final(committed map[string]Event, txns []Txn) Report {
	v.mu.Lock()
	defer v.mu.Unlock()
	rep := Report{Rows: len(committed), Duplicates: v.dups, DupDiffer: len(v.dupDiffers),
		BadRecords: len(v.badRecords), Delivered: len(v.first) + v.dups, Samples: len(v.samples)}
	for _, s := range v.dupDiffers {
		rep.example("duplicate differs: %s", s)
	}
	for _, s := range v.badRecords {
		rep.example("bad record: %s", s)
	}
	type first struct {
		id string
		delivery
	}
	var firsts []first
	parts := map[string]map[int]bool{} // aggregate -> partitions of its first deliveries
	for id, d := range v.first {
		e, ok := committed[id]
		if !ok {
			rep.Unknown++
			rep.example("unknown id in %s: %s (%d@%d)", v.Topic, id, d.partition, d.offset)
			continue
		}
		rep.Distinct++
		if parts[e.Key] == nil {
			parts[e.Key] = map[int]bool{}
		}
		parts[e.Key][d.partition] = true
		if d.key != e.Key || d.tipus != e.Tipus {
			rep.Mismatch++
			rep.example("mismatch: id %s read with key %q tipus %q, the row has %q and %q", id, d.key, d.tipus, e.Key, e.Tipus)
		}
		firsts = append(firsts, first{id, d})
	}
	for _, ps := range parts {
		if len(ps) > 1 {
			rep.Moved++
		}
	}
	for id, e := range committed {
		if _, ok := v.first[id]; !ok {
			rep.Lost++
			rep.LostIDs = append(rep.LostIDs, id)
			rep.example("lost: id %s (aggregate %s, position %d)", id, e.Key, e.Pos)
		}
	}
	// Commit order: per aggregate, the first deliveries in partition and
	// offset order carry increasing positions.
	sort.Slice(firsts, func(i, j int) bool {
		if firsts[i].partition != firsts[j].partition {
			return firsts[i].partition < firsts[j].partition
		}
		return firsts[i].offset < firsts[j].offset
	})
	last := map[string]int64{}
	for _, f := range firsts {
		e := committed[f.id]
		if e.Pos == 0 {
			continue
		}
		if prev := last[e.Key]; e.Pos <= prev {
			rep.OrderErrors++
			if !slices.Contains(rep.OrderKeys, e.Key) {
				rep.OrderKeys = append(rep.OrderKeys, e.Key)
			}
			rep.example("order: aggregate %s: id %s (position %d, %d@%d) first delivered after position %d", e.Key, f.id, e.Pos, f.partition, f.offset, prev)
		}
		last[e.Key] = max(last[e.Key], e.Pos)
	}
	// The confirmed-position check: for each transaction, the first sample
	// whose confirmed_flush_lsn is at or past U (an upper bound of its commit
	// end) must have every record of the transaction below the high
	// watermark read right after it.
	samples := v.samples
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].at.Before(samples[j].at) })
	for _, t := range txns {
		if t.U == 0 {
			continue
		}
		for _, s := range samples {
			if s.confirmed < t.U {
				continue
			}
			rep.Checked++
			for _, id := range t.IDs {
				d, ok := v.first[id]
				if !ok || d.offset >= s.hw[d.partition] {
					rep.LSNViolations++
					where := "never delivered"
					if ok {
						where = fmt.Sprintf("delivered at %d@%d, high watermark was %d", d.partition, d.offset, s.hw[d.partition])
					}
					rep.example("confirmed_flush_lsn %s at %s passed U=%s of id %s: %s", s.confirmed, s.at.Format("15:04:05.000"), t.U, id, where)
					break
				}
			}
			break
		}
	}
	return rep
}
