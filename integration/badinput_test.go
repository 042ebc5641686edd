package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// looseSchema is an outbox without the seed's NOT NULL constraints and types:
// what a careless service might have.
const looseSchema = `CREATE TABLE outbox (id TEXT PRIMARY KEY, agregat TEXT, agregat_id TEXT, tipus TEXT, versio TEXT, carrega TEXT, creat_en TIMESTAMPTZ DEFAULT now());`

// dlqRoute routes the outbox table to topic, its bad rows to dlq.
func dlqRoute(topic, dlq string) testenv.Route {
	return testenv.Route{Table: "public.outbox", Topic: topic, More: testenv.Section{"on_error": "dead_letter", "dead_letter_topic": dlq}}
}

func consumeExactly(t *testing.T, topic string, want int) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs, err := testenv.Consume(ctx, env.KafkaBrokers, topic, want)
	if err != nil {
		t.Fatalf("consume %s: %d of %d: %v", topic, len(msgs), want, err)
	}
	// Nothing more than that arrives.
	tctx, tcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer tcancel()
	if all, _ := testenv.Consume(tctx, env.KafkaBrokers, topic, 0); len(all) != want {
		t.Fatalf("%s holds %d records, want exactly %d", topic, len(all), want)
	}
	return msgs
}

// TestBadRowStopsWithClearError: a row that cannot become a record (here a
// versio that is not a number, in a table without the seed's types) stops
// outboxd with an error naming the table, the column and the reason; the
// rows before it are delivered and the slot does not pass it.
func TestBadRowStopsWithClearError(t *testing.T) {
	schema := `CREATE TABLE outbox (id TEXT PRIMARY KEY, agregat TEXT, agregat_id TEXT, tipus TEXT, versio TEXT, carrega TEXT, creat_en TIMESTAMPTZ DEFAULT now());`
	f := newFixture(t, schema, map[string]int{"comandes": 1})
	ctx := context.Background()
	cfg := f.config(seedRoute(f.topic("comandes")))
	cfg.Postgres["snapshot"] = "none" // the table has no publicat_en: no relay served it
	d := f.start(cfg)
	good := "INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega) VALUES ('%s', 'comanda', 'K-1', 'comanda.creada', '%s', '%s')"
	if _, err := f.db.Exec(ctx, fmt.Sprintf(good, "ok-1", "2", `{"a": 1}`)); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	if _, err := f.db.Exec(ctx, fmt.Sprintf(good, "bad-1", "dos", `{"a": 2}`)); err != nil {
		t.Fatal(err)
	}
	err := d.exited(30 * time.Second)
	if err == nil {
		t.Fatal("outboxd exited 0 on a bad row")
	}
	log := d.Log()
	for _, want := range []string{`outbox row id="bad-1" in public.outbox`, `column "versio": not an integer`,
		"A committed row cannot be changed", "on_error: dead_letter"} {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, log)
		}
	}
	// ok-1 is in Kafka and confirmed: the slot has passed it (which also
	// shows slotPassed tells the two apart), not the bad row.
	if passed := f.slotPassed("bad-1", "ok-1"); len(passed) != 1 || passed[0] != "ok-1" {
		c, _ := f.slot()
		t.Errorf("the slot at %s passed %v; want only ok-1, not the bad row", c, passed)
	}
	// Exactly one record (the topic's offsets), and it is ok-1 (read with
	// time enough for a loaded machine; 3 s of reading once got none).
	n := f.topicSize(f.topic("comandes"))
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := testenv.Consume(cctx, env.KafkaBrokers, f.topic("comandes"), 1)
	if n != 1 || err != nil || len(msgs) != 1 || header(msgs[0], "id_esdeveniment") != "ok-1" {
		t.Errorf("want exactly the good row in Kafka, got %d records (%d read: %v)", n, len(msgs), err)
	}
}

// TestDeadLetterBadRows: rows that cannot become records go to the route's
// dead-letter topic, with the original key and the row, and headers naming
// the reason, the table, the LSN and the time; the good rows around them
// flow on, and the slot passes the bad rows once their dead-letter records
// are acknowledged.
func TestDeadLetterBadRows(t *testing.T) {
	f := newFixture(t, looseSchema, map[string]int{"comandes": 1, "comandes.dlq": 1})
	ctx := context.Background()
	cfg := f.config(dlqRoute(f.topic("comandes"), f.topic("comandes.dlq")))
	cfg.Postgres["snapshot"] = "none" // looseSchema has no publicat_en: no relay served it
	d := f.start(cfg)
	ins := "INSERT INTO outbox (id, agregat, agregat_id, tipus, versio, carrega) VALUES ($1, 'comanda', $2, $3, $4, $5)"
	big := `{"farciment": "` + strings.Repeat("x", 1200<<10) + `"}`
	rows := []struct {
		id             string
		key, tipus     any
		versio, carreg any
		bad            string // expected reason, "" for a good row
	}{
		{"ok-1", "K-1", "comanda.creada", "1", `{"a": 1}`, ""},
		{"bad-null-key", nil, "comanda.creada", "1", `{"a": 2}`, `column "agregat_id": the value is NULL`},
		{"bad-versio", "K-2", "comanda.creada", "dos", `{"a": 3}`, `column "versio": not an integer`},
		{"bad-carrega", "K-3", "comanda.creada", "1", "hola", "not valid JSON"},
		{"bad-null-tipus", "K-4", nil, "1", `{"a": 5}`, `column "tipus": the value is NULL`},
		{"bad-too-large", "K-5", "comanda.creada", "1", big, "over kafka.batch_bytes"},
		{"ok-2", "K-1", "comanda.pagada", "2", `{"a": 7}`, ""},
	}
	for _, r := range rows {
		if _, err := f.db.Exec(ctx, ins, r.id, r.key, r.tipus, r.versio, r.carreg); err != nil {
			t.Fatal(err)
		}
	}
	end := f.walLSN()
	good := consumeExactly(t, f.topic("comandes"), 2)
	if header(good[0], "id_esdeveniment") != "ok-1" || header(good[1], "id_esdeveniment") != "ok-2" {
		t.Fatalf("good rows: %v, %v", good[0].Headers, good[1].Headers)
	}
	dead := consumeExactly(t, f.topic("comandes.dlq"), 5)
	i := 0
	for _, r := range rows {
		if r.bad == "" {
			continue
		}
		m := dead[i]
		i++
		if reason := header(m, "outboxd.error"); !strings.Contains(reason, r.bad) || !strings.Contains(reason, "public.outbox") {
			t.Errorf("%s: reason %q, want %q", r.id, reason, r.bad)
		}
		if header(m, "outboxd.table") != "public.outbox" || header(m, "outboxd.lsn") == "" || header(m, "id_esdeveniment") != r.id {
			t.Errorf("%s: headers %v", r.id, m.Headers)
		}
		if ts, err := time.Parse(time.RFC3339Nano, header(m, "outboxd.time")); err != nil || time.Since(ts) > time.Minute {
			t.Errorf("%s: outboxd.time %q", r.id, header(m, "outboxd.time"))
		}
		wantKey := ""
		if r.key != nil {
			wantKey = r.key.(string)
		}
		if string(m.Key) != wantKey {
			t.Errorf("%s: key %q, want the original %q", r.id, m.Key, wantKey)
		}
		if r.id == "bad-too-large" {
			if m.Value != nil || header(m, "outboxd.original_size") == "" {
				t.Errorf("too large: value of %d bytes, size header %q", len(m.Value), header(m, "outboxd.original_size"))
			}
			continue
		}
		var row map[string]*string
		if err := json.Unmarshal(m.Value, &row); err != nil {
			t.Fatalf("%s: value is not the row as JSON: %v: %s", r.id, err, m.Value)
		}
		if row["id"] == nil || *row["id"] != r.id || row["carrega"] == nil || *row["carrega"] != r.carreg || len(row) != 7 {
			t.Errorf("%s: row %s", r.id, m.Value)
		}
	}
	f.waitConfirmed(end, 30*time.Second)
	if st := d.status(); st.State != "streaming" || st.Counters.DeadLettered != 5 {
		t.Fatalf("status after dead-lettering: %+v", st)
	}
	if log := d.Log(); strings.Count(log, "row dead-lettered") != 5 {
		t.Errorf("want one warning per dead-lettered row:\n%s", log)
	}
	d.term()
}

// TestRenamedColumnDeadLettersThenRecovers: a mapped column renamed while
// streaming makes the next rows bad input (dead-lettered, named); renamed
// back, rows flow again.
func TestRenamedColumnDeadLettersThenRecovers(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1, "dlq": 1})
	ctx := context.Background()
	d := f.start(f.config(dlqRoute(f.topic("comandes"), f.topic("dlq"))))
	w := newWriter(f, 30, 3, "outbox")
	if err := w.txn(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, "ALTER TABLE outbox RENAME COLUMN tipus TO kind"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, kind, carrega) VALUES ('00000000-0000-4000-8000-0000000000c1', 'comanda', 'K', 'x', '{}')"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(ctx, "ALTER TABLE outbox RENAME COLUMN kind TO tipus"); err != nil {
		t.Fatal(err)
	}
	if err := w.txn(ctx, 2); err != nil {
		t.Fatal(err)
	}
	dead := consumeExactly(t, f.topic("dlq"), 1)
	if reason := header(dead[0], "outboxd.error"); !strings.Contains(reason, `column "tipus": the column does not exist`) {
		t.Fatalf("reason %q", reason)
	}
	// The verifier compares the topic with the table: take the
	// dead-lettered row out of the table (deletes are not published).
	if _, err := f.db.Exec(ctx, "DELETE FROM outbox WHERE id = '00000000-0000-4000-8000-0000000000c1'"); err != nil {
		t.Fatal(err)
	}
	w.verify(ctx, f.topic("comandes"), "murmur2")
	d.term()
}

// TestTooLargeRowStops: with the default on_error (stop), a row larger than
// the broker's max.message.bytes stops outboxd with an actionable error; the
// slot stays before it.
func TestTooLargeRowStops(t *testing.T) {
	f := newFixture(t, seedSchema, map[string]int{"comandes": 1})
	ctx := context.Background()
	d := f.start(f.config(seedRoute(f.topic("comandes"))))
	big := `{"farciment": "` + strings.Repeat("y", 1500<<10) + `"}`
	if _, err := f.db.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ('00000000-0000-4000-8000-0000000000d1', 'comanda', 'K', 'comanda.creada', $1)", big); err != nil {
		t.Fatal(err)
	}
	if err := d.exited(30 * time.Second); err == nil {
		t.Fatal("outboxd exited 0")
	}
	if log := d.Log(); !strings.Contains(log, "over kafka.batch_bytes") || !strings.Contains(log, "max.message.bytes") {
		t.Fatalf("the error is not actionable:\n%s", log)
	}
	if passed := f.slotPassed("00000000-0000-4000-8000-0000000000d1"); len(passed) > 0 {
		c, _ := f.slot()
		t.Fatalf("the slot passed the row: confirmed at %s", c)
	}
}

// randomText is n bytes of incompressible, JSON-safe text.
func randomText(seed uint64, n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// TestBrokerRefusedRecordIsDeadLettered: the topic's max.message.bytes is
// below kafka.batch_bytes, so a row that becomes a valid record is still
// refused by the broker. On a dead_letter route the producer isolates it
// (splitting the refused batch), it is dead-lettered with its key and size,
// and the rows around it, in the same transaction, are delivered; the slot
// passes the transaction.
func TestBrokerRefusedRecordIsDeadLettered(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, map[string]int{"comandes.dlq": 1})
	ctx := context.Background()
	topic := f.topic("comandes")
	if err := testenv.CreateTopicWith(ctx, env.KafkaBrokers, topic, 1, map[string]string{"max.message.bytes": "20000"}); err != nil {
		t.Fatal(err)
	}
	cfg := f.config(dlqRoute(topic, f.topic("comandes.dlq")))
	cfg.Kafka["linger"] = "200ms" // the three records share one batch
	d := f.start(cfg)
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ins := "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ($1, 'comanda', $2, 'comanda.creada', $3)"
	for i, size := range []int{100, 60000, 100} {
		id := fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i)
		if _, err := tx.Exec(ctx, ins, id, fmt.Sprintf("K-%d", i), `{"x": "`+randomText(uint64(i), size)+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	end := f.walLSN()
	f.waitConfirmed(end, 30*time.Second)
	msgs := consumeExactly(t, topic, 2)
	if string(msgs[0].Key) != "K-0" || string(msgs[1].Key) != "K-2" {
		t.Errorf("delivered keys %q, %q; want K-0, K-2 in order", msgs[0].Key, msgs[1].Key)
	}
	dlq := consumeExactly(t, f.topic("comandes.dlq"), 1)
	m := dlq[0]
	size, _ := strconv.Atoi(header(m, "outboxd.original_size"))
	if string(m.Key) != "K-1" || header(m, "id_esdeveniment") != "00000000-0000-4000-8000-000000000001" || size < 60000 ||
		!strings.Contains(header(m, "outboxd.error"), "Too Large") || header(m, "outboxd.table") != "public.outbox" || m.Value != nil {
		t.Errorf("dead letter: key %q value %d bytes headers %v", m.Key, len(m.Value), m.Headers)
	}
	if st := d.status(); st.State != "streaming" || st.Counters.DeadLettered != 1 {
		t.Errorf("after the refusal: %+v", st)
	}
	d.term()
}

// TestRefusedBatchIsSplit: a batch that fits kafka.batch_bytes but not the
// topic's max.message.bytes once compressed (here incompressible payloads
// and a topic limit far below batch_bytes; the sink's unit tests cover a
// batch that only grows past the limit by compression) is refused by the
// broker; the producer splits it and sends the halves, in order, until
// they fit, on a route that stops on bad input: every row arrives, in
// order, and outboxd keeps streaming.
func TestRefusedBatchIsSplit(t *testing.T) {
	kafkaOnly(t)
	f := newFixture(t, seedSchema, nil)
	ctx := context.Background()
	topic := f.topic("comandes")
	if err := testenv.CreateTopicWith(ctx, env.KafkaBrokers, topic, 1, map[string]string{"max.message.bytes": "20000"}); err != nil {
		t.Fatal(err)
	}
	cfg := f.config(seedRoute(topic))
	cfg.Kafka["compression"] = "lz4"
	cfg.Kafka["linger"] = "200ms" // the whole transaction in one batch of ~65 KB
	d := f.start(cfg)
	tx, err := f.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const rows = 40
	for i := 0; i < rows; i++ {
		if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega) VALUES ($1, 'comanda', 'K', 'comanda.creada', $2)",
			fmt.Sprintf("00000000-0000-4000-8000-%012d", i), `{"x": "`+randomText(uint64(100+i), 1500)+`"}`); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.walLSN(), 30*time.Second)
	msgs := consumeExactly(t, topic, rows)
	for i, m := range msgs {
		if want := fmt.Sprintf("00000000-0000-4000-8000-%012d", i); header(m, "id_esdeveniment") != want {
			t.Fatalf("record %d is %s, want %s", i, header(m, "id_esdeveniment"), want)
		}
	}
	if !strings.Contains(d.Log(), "TOO_LARGE") || !strings.Contains(d.Log(), "sending it again in two") {
		t.Errorf("no batch was split: the test did not make the broker refuse one:\n%s", d.Log())
	}
	d.term()
}

// TestInvalidTimestampFollowsOnError (issue 19 item 8): a topic that takes
// CreateTime timestamps at most an hour old (message.timestamp.before.max.ms),
// a route whose records carry creat_en as their timestamp
// (routes[].timestamp), and old pending rows when outboxd first starts: the
// cut-over snapshot publishes them and the broker refuses the old one with
// INVALID_TIMESTAMP, whatever the retries. On a dead_letter route it is
// dead-lettered with the way out, the rows around it are delivered in
// order and the snapshot finishes (an old row streamed later likewise); on
// a stop route outboxd stops with the way out (the topic's limits,
// LogAppendTime, or no routes[].timestamp). Before, both stopped, and every
// start published the snapshot again into the same refusal.
func TestInvalidTimestampFollowsOnError(t *testing.T) {
	kafkaOnly(t)
	for _, deadLetter := range []bool{true, false} {
		t.Run(map[bool]string{true: "dead_letter", false: "stop"}[deadLetter], func(t *testing.T) {
			f := newFixture(t, seedSchema, map[string]int{"comandes.dlq": 1})
			ctx := context.Background()
			topic, dlq := f.topic("comandes"), f.topic("comandes.dlq")
			if err := testenv.CreateTopicWith(ctx, env.KafkaBrokers, topic, 1, map[string]string{"message.timestamp.before.max.ms": "3600000"}); err != nil {
				t.Fatal(err)
			}
			insert := func(key, age string) {
				t.Helper()
				if _, err := f.db.Exec(ctx, `INSERT INTO outbox (id, agregat, agregat_id, tipus, carrega, creat_en)
					VALUES (gen_random_uuid(), 'comanda', $1, 'comanda.creada', '{}', now() - $2::interval)`, key, age); err != nil {
					t.Fatal(err)
				}
			}
			insert("K-0", "1 second")
			insert("K-1", "2 days")
			insert("K-2", "1 second")
			route := seedRoute(topic)
			route.More = testenv.Section{"timestamp": "creat_en"}
			if deadLetter {
				route.More["on_error"], route.More["dead_letter_topic"] = "dead_letter", dlq
			}
			cfg := f.config(route)
			cfg.Kafka["linger"] = "200ms" // the snapshot's records share a batch
			if !deadLetter {
				d := f.spawn(cfg)
				if err := d.exited(60 * time.Second); err == nil {
					t.Fatal("outboxd exited 0")
				}
				log := d.Log()
				for _, want := range []string{fmt.Sprintf("a record for topic %q", topic), "INVALID_TIMESTAMP", "message.timestamp.before.max.ms", "LogAppendTime", "routes[].timestamp", "on_error: dead_letter"} {
					if !strings.Contains(log, want) {
						t.Errorf("the error does not say %q:\n%s", want, log)
					}
				}
				if strings.Contains(log, "K-1") {
					t.Errorf("the error quotes the record's key, a row's content (issue 19 item 13):\n%s", log)
				}
				t.Logf("outboxd stopped with: %s", lastLine(log))
				return
			}
			d := f.start(cfg)
			insert("K-3", "3 days") // streamed
			insert("K-4", "1 second")
			f.waitConfirmed(f.walLSN(), 30*time.Second)
			msgs := consumeExactly(t, topic, 3)
			for i, want := range []string{"K-0", "K-2", "K-4"} {
				if string(msgs[i].Key) != want {
					t.Fatalf("record %d has key %q, want %s", i, msgs[i].Key, want)
				}
			}
			dead := consumeExactly(t, dlq, 2)
			for i, want := range []string{"K-1", "K-3"} {
				m := dead[i]
				if e := header(m, "outboxd.error"); string(m.Key) != want || !strings.Contains(e, "INVALID_TIMESTAMP") || !strings.Contains(e, "LogAppendTime") {
					t.Errorf("dead letter %d: key %q, error %q; want %s and the way out", i, m.Key, e, want)
				}
			}
			t.Logf("dead-lettered: %s", header(dead[0], "outboxd.error"))
			if st := d.status(); st.State != "streaming" {
				t.Errorf("after the refusals: %+v", st)
			}
			d.term()
		})
	}
}
