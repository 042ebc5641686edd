package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// delivery is the first time a record for one outbox id was read.
type delivery struct {
	partition int
	offset    int64
	key       string
	hash      uint64 // of key, headers and value: a duplicate must match it
	seq       int64
	tipus     string
	at        time.Time
}

// sample is one read of the slot's confirmed_flush_lsn followed by one read
// of every partition's high watermark.
type sample struct {
	at        time.Time
	confirmed pglogrepl.LSN
	hw        map[int]int64
}

// Verifier consumes the topic from the beginning while the scenario runs.
type Verifier struct {
	Brokers    string // the broker's direct listener
	Topic      string
	Partitions int
	DSN        string // direct, for the slot samples
	Slot       string

	mu         sync.Mutex
	first      map[string]delivery
	lastSeq    map[string]int64 // aggregate -> seq of its latest first delivery
	dups       int
	dupDiffers []string
	orderErrs  []string
	badRecords []string
	offsets    map[int]int64 // next offset to read, per partition
	samples    []sample
	seen       atomic.Int64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start begins consuming and sampling.
func (v *Verifier) Start(ctx context.Context) {
	v.first = map[string]delivery{}
	v.lastSeq = map[string]int64{}
	v.offsets = map[int]int64{}
	ctx, v.cancel = context.WithCancel(ctx)
	for p := 0; p < v.Partitions; p++ {
		v.wg.Add(1)
		go v.consume(ctx, p)
	}
	v.wg.Add(1)
	go v.sampleLoop(ctx)
}

// Stop ends consuming and sampling.
func (v *Verifier) Stop() {
	v.cancel()
	v.wg.Wait()
}

func (v *Verifier) consume(ctx context.Context, p int) {
	defer v.wg.Done()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{v.Brokers}, Topic: v.Topic, Partition: p,
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

type envelopeValue struct {
	ID    string `json:"id_esdeveniment"`
	Tipus string `json:"tipus"`
	Dades struct {
		ID  string `json:"id"`
		Seq int64  `json:"seq"`
	} `json:"dades"`
}

func (v *Verifier) record(m kafka.Message) {
	h := fnv.New64a()
	h.Write(m.Key)
	h.Write([]byte{0})
	var id, tipus string
	for _, hd := range m.Headers {
		h.Write([]byte(hd.Key))
		h.Write([]byte{0})
		h.Write(hd.Value)
		h.Write([]byte{0})
		switch hd.Key {
		case "id_esdeveniment":
			id = string(hd.Value)
		case "tipus":
			tipus = string(hd.Value)
		}
	}
	h.Write(m.Value)
	var env envelopeValue
	err := json.Unmarshal(m.Value, &env)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.offsets[m.Partition] = m.Offset + 1
	if err != nil || env.ID != id || id == "" || env.Dades.ID != string(m.Key) || env.Tipus != tipus {
		v.badRecords = append(v.badRecords, fmt.Sprintf("%d@%d: header id %q, value %s", m.Partition, m.Offset, id, m.Value))
		return
	}
	d := delivery{partition: m.Partition, offset: m.Offset, key: string(m.Key), hash: h.Sum64(), seq: env.Dades.Seq, tipus: tipus, at: time.Now()}
	if prev, ok := v.first[id]; ok {
		v.dups++
		if prev.hash != d.hash {
			v.dupDiffers = append(v.dupDiffers, fmt.Sprintf("%s: %d@%d and %d@%d differ", id, prev.partition, prev.offset, d.partition, d.offset))
		}
		return
	}
	v.first[id] = d
	v.seen.Add(1)
	// Commit order per aggregate is seq order, and nothing may be skipped.
	if last := v.lastSeq[d.key]; d.seq != last+1 {
		v.orderErrs = append(v.orderErrs, fmt.Sprintf("aggregate %s: first delivery of seq %d (id %s, %d@%d) after seq %d", d.key, d.seq, id, d.partition, d.offset, last))
	}
	if d.seq > v.lastSeq[d.key] {
		v.lastSeq[d.key] = d.seq
	}
}

// Seen reports whether id was delivered.
func (v *Verifier) Seen(id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.first[id]
	return ok
}

// Dups is how many duplicate records were read so far.
func (v *Verifier) Dups() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.dups
}

// Distinct is how many distinct ids were delivered.
func (v *Verifier) Distinct() int64 { return v.seen.Load() }

// WaitSeen waits until every id of txns was delivered; it returns when the
// last one was, or an error after timeout.
func (v *Verifier) WaitSeen(ctx context.Context, txns []Txn, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	i, j := 0, 0
	for {
		v.mu.Lock()
		for i < len(txns) {
			ids := txns[i].IDs
			for j < len(ids) {
				if _, ok := v.first[ids[j]]; !ok {
					break
				}
				j++
			}
			if j < len(ids) {
				break
			}
			i, j = i+1, 0
		}
		v.mu.Unlock()
		if i == len(txns) {
			return time.Now(), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, fmt.Errorf("after %s, %d of %d transactions still not delivered (e.g. id %s)", timeout, len(txns)-i, len(txns), txns[i].IDs[j])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (v *Verifier) sampleLoop(ctx context.Context) {
	defer v.wg.Done()
	client := &kafka.Client{Addr: kafka.TCP(v.Brokers), Timeout: 2 * time.Second}
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	reqs := make([]kafka.OffsetRequest, v.Partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
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
			if err != pgx.ErrNoRows {
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
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := client.ListOffsets(lctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{v.Topic: reqs}})
		cancel()
		if err != nil {
			continue
		}
		hw := map[int]int64{}
		ok := true
		for _, po := range resp.Topics[v.Topic] {
			if po.Error != nil {
				ok = false
				break
			}
			hw[po.Partition] = po.LastOffset
		}
		if !ok || len(hw) != v.Partitions {
			continue
		}
		v.mu.Lock()
		v.samples = append(v.samples, sample{at: time.Now(), confirmed: confirmed, hw: hw})
		v.mu.Unlock()
	}
}

// CaughtUp waits until the consumer has read every partition up to its
// current high watermark.
func (v *Verifier) CaughtUp(ctx context.Context, timeout time.Duration) error {
	client := &kafka.Client{Addr: kafka.TCP(v.Brokers), Timeout: 5 * time.Second}
	reqs := make([]kafka.OffsetRequest, v.Partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	deadline := time.Now().Add(timeout)
	var hw map[int]int64
	for hw == nil {
		resp, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{v.Topic: reqs}})
		if err == nil {
			hw = map[int]int64{}
			for _, po := range resp.Topics[v.Topic] {
				hw[po.Partition] = po.LastOffset
			}
		} else if time.Now().After(deadline) {
			return fmt.Errorf("read high watermarks: %w", err)
		} else {
			time.Sleep(200 * time.Millisecond)
		}
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
			return fmt.Errorf("consumer did not reach the high watermarks %v within %s", hw, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Report is what the verifier found.
type Report struct {
	Rows          int // rows in the outbox table
	Delivered     int // records read (duplicates included)
	Lost          int
	Duplicates    int
	DupDiffer     int
	OrderErrors   int
	BadRecords    int
	Unknown       int // records whose id is not in the table
	Mismatch      int // records whose key/seq/tipus differ from the row
	LSNViolations int // confirmed_flush_lsn passed a record Kafka did not hold yet
	Samples       int
	Checked       int // transactions covered by a sample
	Examples      []string
}

// OK is true when nothing is wrong.
func (r Report) OK() bool {
	return r.Lost == 0 && r.DupDiffer == 0 && r.OrderErrors == 0 && r.BadRecords == 0 && r.Unknown == 0 && r.Mismatch == 0 && r.LSNViolations == 0
}

func (r *Report) example(s string) {
	if len(r.Examples) < 8 {
		r.Examples = append(r.Examples, s)
	}
}

// Final compares what was read with the outbox table and the slot samples
// with the writers' commit positions. Call after Stop.
func (v *Verifier) Final(ctx context.Context, txns []Txn) (Report, error) {
	conn, err := pgx.Connect(ctx, v.DSN)
	if err != nil {
		return Report{}, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT id::text, agregat_id, tipus, (carrega->>'seq')::bigint FROM outbox")
	if err != nil {
		return Report{}, err
	}
	type dbRow struct {
		key, tipus string
		seq        int64
	}
	table := map[string]dbRow{}
	for rows.Next() {
		var id string
		var r dbRow
		if err := rows.Scan(&id, &r.key, &r.tipus, &r.seq); err != nil {
			return Report{}, err
		}
		table[id] = r
	}
	if err := rows.Err(); err != nil {
		return Report{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	rep := Report{Rows: len(table), Duplicates: v.dups, DupDiffer: len(v.dupDiffers), OrderErrors: len(v.orderErrs),
		BadRecords: len(v.badRecords), Delivered: len(v.first) + v.dups, Samples: len(v.samples)}
	for _, s := range v.dupDiffers {
		rep.example("duplicate differs: " + s)
	}
	for _, s := range v.orderErrs {
		rep.example("order: " + s)
	}
	for _, s := range v.badRecords {
		rep.example("bad record: " + s)
	}
	for id, r := range table {
		d, ok := v.first[id]
		if !ok {
			rep.Lost++
			rep.example(fmt.Sprintf("lost: id %s (aggregate %s seq %d)", id, r.key, r.seq))
			continue
		}
		if d.key != r.key || d.seq != r.seq || d.tipus != r.tipus {
			rep.Mismatch++
			rep.example(fmt.Sprintf("mismatch: id %s key %s seq %d, row %s seq %d", id, d.key, d.seq, r.key, r.seq))
		}
	}
	for id := range v.first {
		if _, ok := table[id]; !ok {
			rep.Unknown++
			rep.example("unknown id in topic: " + id)
		}
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
					rep.example(fmt.Sprintf("confirmed_flush_lsn %s at %s passed U=%s of id %s: %s", s.confirmed, s.at.Format("15:04:05.000"), t.U, id, where))
					break
				}
			}
			break
		}
	}
	return rep, nil
}
