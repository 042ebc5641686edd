package integration_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/testenv"
)

// The idempotent producer (kafka.idempotence, on by default; issue 21 item
// 1) against real brokers: a produce answer lost after the broker appended
// the batch, and partition leaders killed under load in a three-broker
// cluster. outboxd keeps running through both (no session restart, so no
// replay from the slot: those duplicates are a restart's, not a retry's),
// and a retried batch is never appended twice.

// ackEater is a TCP proxy in front of a broker's listener that, while armed,
// forwards a produce request and swallows the broker's answer to it,
// closing the connection: the broker appended the batch and the producer
// never hears so, as when a connection dies or a leader is killed between
// its append and its answer. It parses Kafka's framing: a request is
// size, api key, api version, correlation id; an answer is size and
// correlation id.
type ackEater struct {
	armed atomic.Int32 // answers still to swallow
	eaten atomic.Int32
}

func (a *ackEater) arm() { a.armed.Add(1) }

// take consumes one arming, if any.
func (a *ackEater) take() bool {
	for {
		n := a.armed.Load()
		if n <= 0 {
			return false
		}
		if a.armed.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (a *ackEater) serve(down, up net.Conn) {
	defer down.Close()
	defer up.Close()
	var mu sync.Mutex
	eat := map[uint32]bool{}
	go func() {
		defer up.Close()
		for {
			frame, err := readFrame(down)
			if err != nil {
				return
			}
			if len(frame) >= 12 && binary.BigEndian.Uint16(frame[4:]) == 0 && a.take() { // api key 0: Produce
				mu.Lock()
				eat[binary.BigEndian.Uint32(frame[8:])] = true
				mu.Unlock()
			}
			if _, err := up.Write(frame); err != nil {
				return
			}
		}
	}()
	for {
		frame, err := readFrame(up)
		if err != nil || len(frame) < 8 {
			return
		}
		mu.Lock()
		swallow := eat[binary.BigEndian.Uint32(frame[4:])]
		mu.Unlock()
		if swallow {
			a.eaten.Add(1)
			return // closes both sides
		}
		if _, err := down.Write(frame); err != nil {
			return
		}
	}
}

// readFrame reads one size-prefixed Kafka frame, prefix included.
func readFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
	copy(frame, size[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// TestLostAcknowledgementIsNotDuplicated: a broker (one replica, so
// appended is acknowledged) behind a proxy that, eight times under load,
// lets a produce request through and swallows its answer. outboxd sends
// each of those batches again; the broker recognises them: every row once,
// in order, and no session restarted. (integrate's build, which has no
// idempotent producer, appended each of those batches twice.)
func TestLostAcknowledgementIsNotDuplicated(t *testing.T) {
	kafkaOnly(t)
	needEnv(t)
	const listener = "ACKEATER"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kafkaEnv, err := testenv.Start(testenv.Options{NoPostgres: true, Listeners: []testenv.Listener{{Name: listener, Advertise: ln.Addr().String()}}})
	if err != nil {
		ln.Close()
		t.Fatalf("start a broker: %v", err)
	}
	t.Cleanup(kafkaEnv.Cleanup)
	target, err := kafkaEnv.KafkaListener(listener)
	if err != nil {
		t.Fatal(err)
	}
	eater := &ackEater{}
	proxyOn(t, ln, target, eater.serve)
	// The database on the suite's PostgreSQL, the topic on this broker.
	f := newFixtureOn(t, &testenv.Env{Dir: kafkaEnv.Dir, PGDSN: env.PGDSN, KafkaBrokers: kafkaEnv.KafkaBrokers}, seedSchema, map[string]int{"comandes": 3})
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.Brokers = ln.Addr().String() // outboxd goes through the proxy, the verifier does not
	d := f.start(cfg)
	ctx := context.Background()
	w := newWriter(f, 21, 60, "outbox")
	stop := steadyWriter(t, w, 2*time.Millisecond)
	const lost = 8
	for i := 1; i <= lost; i++ {
		time.Sleep(300 * time.Millisecond)
		eater.arm()
		eventually(t, 60*time.Second, fmt.Sprintf("produce answer %d swallowed", i), func() bool { return eater.eaten.Load() >= int32(i) })
	}
	time.Sleep(500 * time.Millisecond)
	stop()
	rep := w.verify(ctx, topic, "murmur2")
	t.Logf("%d produce answers swallowed: %+v", eater.eaten.Load(), rep)
	noSessionRestart(t, d)
	if rep.Duplicates != 0 {
		t.Fatalf("%d records duplicated after %d lost produce answers: retries were appended again", rep.Duplicates, lost)
	}
	d.term()
}

// TestLeaderKillNoDuplicates: a cluster of three brokers (replication
// factor 3, min.insync.replicas 2), a topic of 6 partitions, ~1,000 rows/s;
// twice, the broker leading the most partitions is killed (kill -9) under
// load, restarted, and waited for until every replica is in sync. The
// batches in flight to the dead leader are sent again to the new one,
// which holds the producer state the old one replicated: every row once,
// in order, and no session restarted (kafka.max_attempts outlasts an
// election). The non-idempotent producer appended such batches twice (605
// duplicates over three kills in the chaos suite's scenario 8a).
func TestLeaderKillNoDuplicates(t *testing.T) {
	kafkaOnly(t)
	needEnv(t)
	cluster := startEnv(t, "a cluster", testenv.Options{NoPostgres: true, KafkaNodes: 3})
	f := newFixtureOn(t, &testenv.Env{Dir: cluster.Dir, PGDSN: env.PGDSN, KafkaBrokers: cluster.KafkaBrokers}, seedSchema, map[string]int{"comandes": 6})
	topic := f.topic("comandes")
	cfg := f.config(seedRoute(topic))
	cfg.Kafka["max_attempts"] = "30"
	d := f.start(cfg)
	ctx := context.Background()
	w := newWriter(f, 34, 300, "outbox")
	stop := steadyWriter(t, w, time.Millisecond)
	for kill := 1; kill <= 2; kill++ {
		time.Sleep(4 * time.Second)
		leaders, err := cluster.Leaders(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		led := map[int]int{}
		busiest := 0
		for _, st := range leaders {
			led[st.Leader]++
			if busiest == 0 || led[st.Leader] > led[busiest] {
				busiest = st.Leader
			}
		}
		if err := cluster.KillBroker(busiest); err != nil {
			t.Fatal(err)
		}
		killedAt := time.Now()
		time.Sleep(8 * time.Second)
		if err := cluster.StartBroker(busiest); err != nil {
			t.Fatal(err)
		}
		if err := cluster.WaitISR(ctx, topic, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		t.Logf("kill %d: broker %d (leading %d of 6 partitions) killed, back and in sync %.1f s later", kill, busiest, led[busiest], time.Since(killedAt).Seconds())
	}
	time.Sleep(2 * time.Second)
	stop()
	rep := w.verify(ctx, topic, "murmur2")
	t.Logf("two leader kills: %+v", rep)
	noSessionRestart(t, d)
	if rep.Duplicates != 0 {
		t.Fatalf("%d records duplicated by the retries after the leader kills", rep.Duplicates)
	}
	d.term()
}

// steadyWriter commits transactions of 1 to 10 rows, pausing between them,
// until the returned stop is called (which waits for the last one).
func steadyWriter(t *testing.T, w *writer, pause time.Duration) (stop func()) {
	t.Helper()
	var halt atomic.Bool
	errc := make(chan error, 1)
	go func() {
		for i := 0; !halt.Load(); i++ {
			if err := w.txn(context.Background(), 1+i%10); err != nil {
				errc <- err
				return
			}
			time.Sleep(pause)
		}
		errc <- nil
	}()
	return func() {
		t.Helper()
		halt.Store(true)
		if err := <-errc; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
}

// noSessionRestart requires outboxd to be running and never to have ended
// a replication session (which replays from the slot).
func noSessionRestart(t *testing.T, d *daemon) {
	t.Helper()
	if !d.Running() {
		t.Fatalf("outboxd exited:\n%s", d.Log())
	}
	if log := d.Log(); strings.Contains(log, "replication interrupted") {
		t.Fatalf("a replication session ended (the records after the slot's position were produced again):\n%s", log)
	}
}

// TestIdempotenceNeedsAProducerID: a broker with ACLs, outboxd's SASL
// user allowed to DESCRIBE the topic but not to WRITE it, nor
// IDEMPOTENT_WRITE on the cluster: the brokers refuse it a producer id.
// check fails its "kafka idempotence" line with the fix, and outboxd stops
// before sending a record, naming the fix, its slot before the rows. Once
// WRITE is granted on the topic (enough since Kafka 2.8, KIP-679), check
// passes and the rows arrive. Without READ, check warns that restart
// de-duplication cannot read the tails, and outboxd says so and produces;
// with READ the line passes. (A Kafka before 2.8, which wanted
// IDEMPOTENT_WRITE whatever else was granted, cannot be started here.)
func TestIdempotenceNeedsAProducerID(t *testing.T) {
	kafkaOnly(t)
	needEnv(t)
	acl := startEnv(t, "a broker with ACLs", testenv.Options{NoPostgres: true, KafkaACLs: true, Listeners: []testenv.Listener{{Name: "SASL", Protocol: "SASL_PLAINTEXT"}}})
	user, passwordFile, err := acl.KafkaSASL()
	if err != nil {
		t.Fatal(err)
	}
	saslAddr, err := acl.KafkaListener("SASL")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureOn(t, &testenv.Env{Dir: acl.Dir, PGDSN: env.PGDSN, KafkaBrokers: acl.KafkaBrokers}, seedSchema, map[string]int{"comandes": 2})
	topic := f.topic("comandes")
	grantOn := func(rt kafka.ResourceType, name string, op kafka.ACLOperationType) {
		t.Helper()
		c := &kafka.Client{Addr: kafka.TCP(acl.KafkaBrokers), Timeout: 10 * time.Second} // PLAINTEXT: the super user
		res, err := c.CreateACLs(context.Background(), &kafka.CreateACLsRequest{ACLs: []kafka.ACLEntry{{
			ResourceType: rt, ResourceName: name, ResourcePatternType: kafka.PatternTypeLiteral,
			Principal: "User:" + user, Host: "*", Operation: op, PermissionType: kafka.ACLPermissionTypeAllow}}})
		if err == nil && len(res.Errors) > 0 {
			err = res.Errors[0]
		}
		if err != nil {
			t.Fatalf("grant %v on %s: %v", op, name, err)
		}
	}
	grant := func(op kafka.ACLOperationType) { t.Helper(); grantOn(kafka.ResourceTypeTopic, topic, op) }
	grant(kafka.ACLOperationTypeDescribe)
	cfg := f.config(seedRoute(topic))
	cfg.Brokers = saslAddr
	cfg.Kafka["sasl"] = fmt.Sprintf("{mechanism: SCRAM-SHA-512, username: %s, password_file: %s}", user, passwordFile)
	path := f.configFile(cfg)

	r := outboxd(t, f.dsn, "check", "-c", path)
	l := r.line("FAIL kafka idempotence:")
	for _, want := range []string{"refused outboxd's principal a producer id", "Cluster Authorization Failed", "IdempotentWrite", "WRITE on the routed topics", "kafka.idempotence: false"} {
		if !strings.Contains(l, want) {
			t.Fatalf("check's idempotence line lacks %q:\n%s", want, r)
		}
	}
	if r.code == 0 {
		t.Errorf("check exited 0 with a failed line:\n%s", r)
	}

	// Ready first: the slot then exists before the rows, so they are in
	// what it streams (rows older than the slot would go to the cut-over
	// snapshot, which the slot never holds).
	d := f.start(cfg)
	w := newWriter(f, 41, 10, "outbox")
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		if err := w.txn(ctx, 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.exited(90 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 without a producer id")
	}
	if last := lastLine(d.Log()); !strings.Contains(last, "producer id") || !strings.Contains(last, "IdempotentWrite") {
		t.Fatalf("outboxd's last line does not name the refusal and its fix: %s", last)
	}
	if passed := f.slotPassed(w.committed...); len(passed) > 0 {
		t.Fatalf("the slot passed rows %v that never reached Kafka", passed)
	}

	grant(kafka.ACLOperationTypeWrite)
	r = outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("PASS kafka idempotence:"); l == "" {
		t.Fatalf("with WRITE on the topic, check's idempotence line does not pass:\n%s", r)
	}
	// Restart de-duplication reads the partitions' tails: without READ,
	// check warns with the ACL, and outboxd says so once and produces.
	if l := r.line("WARN kafka deduplicate:"); !strings.Contains(l, "may not READ "+topic) || !strings.Contains(l, "--operation Read") {
		t.Fatalf("without READ, check's deduplicate line does not warn with the fix:\n%s", r)
	}
	d = f.start(cfg)
	rep := w.verify(ctx, topic, "murmur2")
	t.Logf("after WRITE was granted: %+v", rep)
	d.term()
	// The topic holds records now: the next session's tail read fetches,
	// is refused, and says so once; the row still arrives.
	d = f.start(cfg)
	if err := w.txn(ctx, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "outboxd's warning that it cannot read the tails", func() bool {
		return strings.Contains(d.Log(), "grant the principal READ on the topic")
	})
	w.verify(ctx, topic, "murmur2")
	d.term()
	grant(kafka.ACLOperationTypeRead)
	r = outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("PASS kafka deduplicate:"); l == "" {
		t.Fatalf("with READ on the topic, check's deduplicate line does not pass:\n%s", r)
	}

	// kafka.transactions: the principal needs DESCRIBE and WRITE on the
	// transactional id. Without them check FAILs with the ACL, and
	// outboxd stops at its first record, the slot where it was.
	cfg.Kafka["transactions"] = "true"
	cfg.Kafka["transactional_id"] = f.name
	path = f.configFile(cfg)
	r = outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("FAIL kafka transactions:"); !strings.Contains(l, "--transactional-id "+f.name) || !strings.Contains(l, "--operation Write --operation Describe") {
		t.Fatalf("without ACLs on the transactional id, check's transactions line does not fail with the fix:\n%s", r)
	}
	d = f.start(cfg)
	before := len(w.committed)
	if err := w.txn(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := d.exited(90 * time.Second); err == nil {
		t.Fatal("outboxd exited 0 without the transactional id")
	}
	if last := lastLine(d.Log()); !strings.Contains(last, "--transactional-id "+f.name) {
		t.Fatalf("outboxd's last line does not name the transactional id's ACL: %s", last)
	}
	if passed := f.slotPassed(w.committed[before:]...); len(passed) > 0 {
		t.Fatalf("the slot passed rows %v that never reached Kafka", passed)
	}
	grantOn(kafka.ResourceTypeTransactionalID, f.name, kafka.ACLOperationTypeDescribe)
	grantOn(kafka.ResourceTypeTransactionalID, f.name, kafka.ACLOperationTypeWrite)
	r = outboxd(t, f.dsn, "check", "-c", path)
	if l := r.line("PASS kafka transactions:"); !strings.Contains(l, "transactional id "+f.name) {
		t.Fatalf("with the ACLs, check's transactions line does not pass:\n%s", r)
	}
	d = f.start(cfg)
	w.load(ctx)
	eventually(t, 60*time.Second, "every row read_committed", func() bool {
		reads, err := testenv.ReadTopic(ctx, acl.KafkaBrokers, topic, "read_committed")
		return err == nil && judgeReads(w, reads).missing == 0
	})
	d.term()
}
