package chaos

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// The cluster scenarios (8a-8e): outboxd producing to a three-broker
// cluster (replication factor 3, min.insync.replicas 2, unclean leader
// election off) under steady load, 10-row transactions over 300
// aggregates, while brokers fail.

const clusterPartitions = 6

// clusterRate is the steady load, rows/s: 2,000 at full size, 1,000 in
// the CI subset (two shared cores also run four JVMs and PostgreSQL).
func (h *Harness) clusterRate() float64 {
	if h.Short {
		return 1000
	}
	return 2000
}

// clusterSetup is setup on the cluster, which starts with the first
// cluster scenario. outboxd's kafka.brokers lists broker 1 alone (a
// deployment behind one address), so a scenario that takes broker 1 down
// also shows outboxd reading metadata from the brokers the cluster
// advertises. The verifier reads readParts partitions (more than the topic
// has at first when partitions will be added: a reader waits for its
// partition to exist).
func (h *Harness) clusterSetup(ctx context.Context, id string, res *Result, readParts int) (*fixture, error) {
	if h.cluster == nil {
		h.Logf("starting a Kafka cluster: %d brokers and a KRaft controller", clusterBrokers)
		c, err := StartCluster()
		if err != nil {
			return nil, fmt.Errorf("start the cluster: %w", err)
		}
		h.cluster = c
	}
	c := h.cluster
	bootstrap, err := c.BrokerAddr(1)
	if err != nil {
		return nil, err
	}
	return h.setupOn(ctx, id, res, clusterPartitions, kafkaSide{createTopic: c.CreateTopic, outboxd: bootstrap, read: c.KafkaBrokers, readParts: readParts})
}

// startSteadyLoad writes 10-row transactions at rate until stopLoad.
func (f *fixture) startSteadyLoad(ctx context.Context, rate float64) {
	lctx, stop := context.WithCancel(ctx)
	f.stopLoad = stop
	f.load = &Load{DSN: f.dsn, Writers: 4, Aggregates: 300, Total: math.MaxInt32, Rate: rate, TxnRows: 10, Prefix: "K-"}
	f.loadCh = make(chan error, 1)
	go func() { f.loadCh <- f.load.Run(lctx) }()
}

// steady is clusterSetup, outboxd streaming and the steady load, 6 s into it.
func (h *Harness) steady(ctx context.Context, res *Result, id string, readParts int) (*fixture, error) {
	f, err := h.clusterSetup(ctx, id, res, readParts)
	if err != nil {
		return nil, err
	}
	if err := f.startDaemon(ctx); err != nil {
		return nil, err
	}
	f.startSteadyLoad(ctx, h.clusterRate())
	return f, sleepCtx(ctx, 6*time.Second)
}

// endLoad lets the load run a little longer, then stops it.
func (f *fixture) endLoad(ctx context.Context) error {
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return err
	}
	f.stopLoad()
	return nil
}

// busiest is the broker leading the partitions that hold the most records
// of the topic.
func (h *Harness) busiest(ctx context.Context, topic string) (int, error) {
	c := h.cluster
	leaders, err := c.Leaders(ctx, topic)
	if err != nil {
		return 0, err
	}
	hw, err := highWatermarks(ctx, c.KafkaBrokers, topic, len(leaders))
	if err != nil {
		return 0, err
	}
	load := map[int]int64{}
	for p, st := range leaders {
		load[st.Leader] += hw[p]
	}
	best, most := 0, int64(-1)
	for b, n := range load {
		if n > most || n == most && b < best {
			best, most = b, n
		}
	}
	if best <= 0 {
		return 0, fmt.Errorf("no leader for %s: %v", topic, leaders)
	}
	return best, nil
}

func highWatermarks(ctx context.Context, brokers, topic string, n int) (map[int]int64, error) {
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...), Timeout: 5 * time.Second}
	reqs := make([]kafka.OffsetRequest, n)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	resp, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, po := range resp.Topics[topic] {
		out[po.Partition] = po.LastOffset
	}
	return out, nil
}

// elected waits until no partition of topic is led by one of gone, and
// returns how long after since that was (the controller's election, as
// the cluster reports it).
func (h *Harness) elected(ctx context.Context, topic string, gone []int, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		leaders, err := h.cluster.Leaders(ctx, topic)
		ok := err == nil && len(leaders) > 0
		for _, st := range leaders {
			for _, g := range gone {
				ok = ok && st.Leader != g && st.Leader >= 0
			}
		}
		if ok {
			return time.Since(since), nil
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("partitions of %s still led by %v after %s", topic, gone, timeout)
}

// metric reads name{topic=...} of the scenario's topic from /metrics.
func (f *fixture) metric(ctx context.Context, name string) float64 {
	return f.daemon.Metric(ctx, name, f.name)
}

// sessions counts outboxd's replication sessions: each one after the
// first is a restart that replays from the slot.
func (f *fixture) sessions() int {
	return strings.Count(f.daemon.Log(), "replication: streaming: ")
}

// brokerFaults is the part every broker scenario shares: a steady load, a
// fault repeated runs times (each returns the broker(s) it took down, when
// it began and whether to restart them), the recovery measured from the
// fault's start, the brokers restarted and back in sync before the next.
func brokerFaults(ctx context.Context, h *Harness, res *Result, id string, runs int,
	fault func(ctx context.Context, f *fixture, run int) (down []int, at time.Time, err error)) error {
	f, err := h.clusterSetup(ctx, id, res, clusterPartitions)
	if err != nil {
		return err
	}
	if err := f.startDaemon(ctx); err != nil {
		return err
	}
	f.startSteadyLoad(ctx, h.clusterRate())
	errs0 := f.metric(ctx, "outboxd_produce_errors_total")
	for run := 0; run < runs; run++ {
		if err := sleepCtx(ctx, randDur(4*time.Second, 6*time.Second)); err != nil {
			return err
		}
		dups0, sessions0 := f.ver.Dups(), f.sessions()
		down, at, err := fault(ctx, f, run)
		if err != nil {
			return err
		}
		res.Runs++
		elect, eerr := h.elected(ctx, f.name, down, at, 60*time.Second)
		rec, err := f.recovered(ctx, at, 3*time.Minute)
		if err != nil {
			return fmt.Errorf("run %d: %w", run+1, err)
		}
		if eerr != nil {
			res.note("run %d: broker %v down: %v; recovered %.1f s after the fault", run+1, down, eerr, rec.Seconds())
		} else {
			res.note("run %d: broker %v down: new leaders %.1f s after the fault, outboxd delivering again %.1f s after it (%.1f s after the election: metadata refresh and retry)",
				run+1, down, elect.Seconds(), rec.Seconds(), (rec - elect).Seconds())
		}
		if err := h.restartBrokers(ctx, f, down); err != nil {
			return err
		}
		res.note("run %d: %d duplicates, %d replication restarts (replays from the slot)", run+1, f.ver.Dups()-dups0, f.sessions()-sessions0)
	}
	res.note("outboxd_produce_errors_total grew by %.0f (records whose produce failed after kafka.max_attempts, replayed from the slot; retries that succeeded are not counted)", f.metric(ctx, "outboxd_produce_errors_total")-errs0)
	if err := f.endLoad(ctx); err != nil {
		return err
	}
	return f.finish(ctx)
}

// restartBrokers starts the brokers again and waits until the topic is
// fully in sync.
func (h *Harness) restartBrokers(ctx context.Context, f *fixture, ids []int) error {
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = h.cluster.StartBroker(id) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	if err := h.cluster.WaitISR(ctx, f.name, 2*time.Minute); err != nil {
		return err
	}
	f.res.note("brokers %v back and every replica in sync %.1f s later", ids, time.Since(t0).Seconds())
	return nil
}

// 8a: kill -9 the broker leading the busiest partitions, restart it.
func leaderKillScenario(ctx context.Context, h *Harness, res *Result) error {
	runs := 3
	if h.Short {
		runs = 1
	}
	return brokerFaults(ctx, h, res, "leaderkill", runs, func(ctx context.Context, f *fixture, _ int) ([]int, time.Time, error) {
		b, err := h.busiest(ctx, f.name)
		if err != nil {
			return nil, time.Time{}, err
		}
		at := time.Now()
		return []int{b}, at, h.cluster.KillBroker(b)
	})
}

// 8b: a controlled shutdown (SIGTERM: leaderships move before the broker
// goes) of the busiest leader, then its restart.
func controlledShutdownScenario(ctx context.Context, h *Harness, res *Result) error {
	return brokerFaults(ctx, h, res, "shutdown", 2, func(ctx context.Context, f *fixture, _ int) ([]int, time.Time, error) {
		b, err := h.busiest(ctx, f.name)
		if err != nil {
			return nil, time.Time{}, err
		}
		at := time.Now()
		err = h.cluster.StopBroker(b)
		f.res.note("broker %d's controlled shutdown took %.1f s", b, time.Since(at).Seconds())
		return []int{b}, at, err
	})
}

// 8c: two brokers of three killed at once and kept down: every partition
// is left with one in-sync replica, under min.insync.replicas, and the
// survivor answers NOT_ENOUGH_REPLICAS. outboxd must hold the slot (no
// acknowledgement, no confirmation) and resume, skipping nothing, once
// they are back.
func twoDownScenario(ctx context.Context, h *Harness, res *Result) error {
	hold := 30 * time.Second
	f, err := h.steady(ctx, res, "twodown", clusterPartitions)
	if err != nil {
		return err
	}
	b, err := h.busiest(ctx, f.name)
	if err != nil {
		return err
	}
	// Broker 1, outboxd's only bootstrap broker, among them.
	down := []int{b, 1}
	if b == 1 {
		down[1] = 2
	}
	at := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, id := range down {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = h.cluster.KillBroker(id) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	res.Runs++
	// Acknowledgements already on their way may land in the first seconds;
	// after that nothing can be acknowledged, so nothing may be confirmed.
	if err := sleepCtx(ctx, 8*time.Second); err != nil {
		return err
	}
	c0, d0 := f.confirmed(ctx), f.ver.Distinct()
	if err := sleepCtx(ctx, time.Until(at.Add(hold))); err != nil {
		return err
	}
	c1, d1 := f.confirmed(ctx), f.ver.Distinct()
	leaders, _ := h.cluster.Leaders(ctx, f.name)
	res.note("brokers %v killed; the survivor's partitions %v; over the last %.0f s of the outage confirmed_flush_lsn went %s -> %s and %d new records were read",
		down, leaders, time.Until(at.Add(hold)).Seconds()+hold.Seconds()-8, c0, c1, d1-d0)
	log := f.daemon.Log()
	res.note("outboxd's log names NOT_ENOUGH_REPLICAS: %v; still running: %v", strings.Contains(log, "Not Enough Replicas") || strings.Contains(log, "NOT_ENOUGH_REPLICAS"), f.daemon.Running())
	if c1 != c0 {
		return fmt.Errorf("confirmed_flush_lsn moved from %s to %s while two brokers of three were down (nothing could be acknowledged)", c0, c1)
	}
	back := time.Now()
	if err := h.restartBrokers(ctx, f, down); err != nil {
		return err
	}
	rec, err := f.recovered(ctx, back, 3*time.Minute)
	if err != nil {
		return err
	}
	res.note("everything committed during the outage delivered %.1f s after the restart began", rec.Seconds())
	if err := f.endLoad(ctx); err != nil {
		return err
	}
	return f.finish(ctx)
}

// 8d: the busiest leader cut off from the other brokers and from the
// controller (a network partition through the proxies), clients still
// reaching it, for longer than replica.lag.time.max.ms (30 s), then healed.
func isolateScenario(ctx context.Context, h *Harness, res *Result) error {
	hold := 45 * time.Second
	f, err := h.steady(ctx, res, "isolate", clusterPartitions)
	if err != nil {
		return err
	}
	b, err := h.busiest(ctx, f.name)
	if err != nil {
		return err
	}
	at := time.Now()
	h.cluster.Isolate(b)
	defer h.cluster.Heal() // also when the scenario fails: the next one needs the whole cluster
	res.Runs++
	elect, eerr := h.elected(ctx, f.name, []int{b}, at, hold)
	rec, err := f.recovered(ctx, at, 3*time.Minute)
	if err != nil {
		return err
	}
	if eerr != nil {
		res.note("broker %d cut off: %v; outboxd delivering again %.1f s after the cut", b, eerr, rec.Seconds())
	} else {
		res.note("broker %d cut off: new leaders %.1f s after the cut (broker.session.timeout.ms 3 s), outboxd delivering again %.1f s after it", b, elect.Seconds(), rec.Seconds())
	}
	if err := sleepCtx(ctx, time.Until(at.Add(hold))); err != nil {
		return err
	}
	healed := time.Now()
	h.cluster.Heal()
	if err := h.cluster.WaitISR(ctx, f.name, 2*time.Minute); err != nil {
		return err
	}
	res.note("healed after %.0f s; every replica in sync %.1f s later; %d replication restarts", healed.Sub(at).Seconds(), time.Since(healed).Seconds(), f.sessions()-1)
	if err := f.endLoad(ctx); err != nil {
		return err
	}
	return f.finish(ctx)
}

// 8e: partitions added to the topic under load (6 to 12). Keys are hashed
// over the partition count: outboxd (kafka.on_partition_change: follow, the
// default) says so in a warning and outboxd_topic_partition_changes_total,
// and from then on hashes over 12. The time until /metrics shows 12 is the
// metadata refresh (metadataTTL, 2 s).
func partitionsAddedScenario(ctx context.Context, h *Harness, res *Result) error {
	f, err := h.steady(ctx, res, "partitions", 2*clusterPartitions)
	if err != nil {
		return err
	}
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(h.cluster.KafkaBrokers, ",")...), Timeout: 10 * time.Second}
	at := time.Now()
	resp, err := client.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{Name: f.name, Count: 2 * clusterPartitions}}})
	if err == nil && resp.Errors[f.name] != nil {
		err = resp.Errors[f.name]
	}
	if err != nil {
		return fmt.Errorf("add partitions: %w", err)
	}
	res.Runs++
	seen := time.Duration(0)
	for time.Since(at) < 30*time.Second {
		if f.metric(ctx, "outboxd_topic_partitions") == 2*clusterPartitions {
			seen = time.Since(at)
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	if seen == 0 {
		return fmt.Errorf("outboxd_topic_partitions did not reach %d within 30 s of adding partitions", 2*clusterPartitions)
	}
	res.recovery(seen)
	changes := f.metric(ctx, "outboxd_topic_partition_changes_total")
	warned := strings.Contains(f.daemon.Log(), "topic partition count changed")
	res.note("partitions %d -> %d: outboxd_topic_partitions showed it %.1f s later (metadata refresh); outboxd_topic_partition_changes_total %.0f; warning logged: %v",
		clusterPartitions, 2*clusterPartitions, seen.Seconds(), changes, warned)
	if changes != 1 || !warned {
		return fmt.Errorf("the partition change was not said: changes metric %.0f, warning %v", changes, warned)
	}
	if err := sleepCtx(ctx, 8*time.Second); err != nil {
		return err
	}
	if err := f.endLoad(ctx); err != nil {
		return err
	}
	err = f.finish(ctx)
	res.note("%d of 300 aggregates moved to another partition (murmur2 over 12 instead of 6: a key stays in p or moves to p+6)", res.Report.Moved)
	return err
}
