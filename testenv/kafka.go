package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/clock"
)

func splitBrokers(brokers string) []string {
	var out []string
	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// CreateTopic creates a topic via the cluster controller (replication factor
// 1) and waits until all partitions have a leader. brokers is "h:p[,h:p...]".
func CreateTopic(ctx context.Context, brokers, topic string, partitions int) error {
	return CreateTopicWith(ctx, brokers, topic, partitions, nil)
}

// CreateTopicWith is CreateTopic with topic-level settings, e.g.
// {"max.message.bytes": "10000"}.
func CreateTopicWith(ctx context.Context, brokers, topic string, partitions int, configs map[string]string) error {
	return createTopic(ctx, brokers, topic, partitions, 1, configs)
}

// createTopic creates a topic with rf replicas of each partition and the
// topic-level settings configs, and waits until every partition has a
// leader and rf replicas in sync.
func createTopic(ctx context.Context, brokers, topic string, partitions, rf int, configs map[string]string) error {
	if partitions <= 0 {
		partitions = 1
	}
	bs := splitBrokers(brokers)
	if len(bs) == 0 {
		return errors.New("testenv: no brokers")
	}
	create := func() error {
		cc, err := dialController(ctx, bs)
		if err != nil {
			return err
		}
		defer cc.Close()
		tc := kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: rf}
		for k, v := range configs {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
		}
		err = cc.CreateTopics(tc)
		if errors.Is(err, kafka.TopicAlreadyExists) {
			return nil
		}
		return err
	}
	var err error
	for {
		if err = create(); err == nil {
			break
		}
		if !clock.Sleep(ctx, clock.System, 200*time.Millisecond) {
			return fmt.Errorf("testenv: create topic %q: %w (last error: %v)", topic, ctx.Err(), err)
		}
	}
	for {
		ps, err := readPartitions(ctx, bs[0], topic)
		if err == nil && len(ps) >= partitions && allLed(ps, rf) {
			return nil
		}
		if !clock.Sleep(ctx, clock.System, 100*time.Millisecond) {
			return fmt.Errorf("testenv: topic %q not ready: %w (last: %d partitions, err %v)", topic, ctx.Err(), len(ps), err)
		}
	}
}

// dialController connects to the cluster's controller, found through the
// first broker.
func dialController(ctx context.Context, brokers []string) (*kafka.Conn, error) {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return nil, err
	}
	return kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, fmt.Sprint(ctrl.Port)))
}

// DeleteTopics deletes topics; one that does not exist is no error.
func DeleteTopics(ctx context.Context, brokers string, topics ...string) error {
	bs := splitBrokers(brokers)
	if len(bs) == 0 {
		return errors.New("testenv: no brokers")
	}
	cc, err := dialController(ctx, bs)
	if err != nil {
		return fmt.Errorf("testenv: delete topics: %w", err)
	}
	defer cc.Close()
	_ = cc.SetDeadline(time.Now().Add(30 * time.Second))
	for _, t := range topics {
		if err := cc.DeleteTopics(t); err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
			return fmt.Errorf("testenv: delete topic %q: %w", t, err)
		}
	}
	return nil
}

func allLed(ps []kafka.Partition, rf int) bool {
	for _, p := range ps {
		if p.Leader.Host == "" || p.Leader.ID < 0 || len(p.Isr) < rf {
			return false
		}
	}
	return true
}

func readPartitions(ctx context.Context, broker, topic string) ([]kafka.Partition, error) {
	conn, err := kafka.DialContext(ctx, "tcp", broker)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return conn.ReadPartitions(topic)
}

// Consume reads all partitions of topic from the first offset (no consumer
// group, one reader per partition) until want messages were read or ctx ends.
// The result is sorted by partition, then offset, and carries Partition,
// Offset, Key, Value, Headers and Time. If ctx ends first, the messages read
// so far are returned together with an error. With want <= 0 it reads until
// ctx ends and returns everything without error (useful to assert "exactly N,
// no more": consume with a short deadline).
func Consume(ctx context.Context, brokers, topic string, want int) ([]kafka.Message, error) {
	bs := splitBrokers(brokers)
	if len(bs) == 0 {
		return nil, errors.New("testenv: no brokers")
	}
	var parts []kafka.Partition
	for {
		ps, err := readPartitions(ctx, bs[0], topic)
		if err == nil && len(ps) > 0 {
			parts = ps
			break
		}
		if !clock.Sleep(ctx, clock.System, 200*time.Millisecond) {
			if want <= 0 {
				return nil, nil
			}
			return nil, fmt.Errorf("testenv: consume %q: no partitions: %w (last error: %v)", topic, ctx.Err(), err)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan kafka.Message, 256)
	var wg sync.WaitGroup
	readers := make([]*kafka.Reader, 0, len(parts))
	for _, p := range parts {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers:   bs,
			Topic:     topic,
			Partition: p.ID,
			MinBytes:  1,
			MaxBytes:  16 << 20,
			MaxWait:   100 * time.Millisecond,
		})
		if err := r.SetOffset(kafka.FirstOffset); err != nil {
			cancel()
			for _, rr := range append(readers, r) {
				_ = rr.Close()
			}
			wg.Wait()
			return nil, err
		}
		readers = append(readers, r)
		wg.Add(1)
		go func(r *kafka.Reader) {
			defer wg.Done()
			for {
				m, err := r.ReadMessage(cctx)
				if err != nil {
					return
				}
				select {
				case ch <- m:
				case <-cctx.Done():
					return
				}
			}
		}(r)
	}

	var msgs []kafka.Message
	var err error
loop:
	for want <= 0 || len(msgs) < want {
		select {
		case m := <-ch:
			msgs = append(msgs, m)
		case <-ctx.Done():
			if want > 0 {
				err = fmt.Errorf("testenv: consumed %d of %d messages from %q: %w", len(msgs), want, topic, ctx.Err())
			}
			break loop
		}
	}
	cancel()
	for _, r := range readers {
		_ = r.Close()
	}
	wg.Wait()
	sort.SliceStable(msgs, func(i, j int) bool {
		if msgs[i].Partition != msgs[j].Partition {
			return msgs[i].Partition < msgs[j].Partition
		}
		return msgs[i].Offset < msgs[j].Offset
	})
	return msgs, err
}

// DeleteRecords deletes topic's records below an offset in each partition
// (-1: up to its high watermark) with the Apache Kafka admin client
// (java/DeleteRecords.java, run from source with the broker's jars), as
// kafka-delete-records.sh and retention do, and returns each partition's
// new log start offset.
func DeleteRecords(ctx context.Context, brokers, topic string, below map[int]int64) (map[int]int64, error) {
	args := []string{brokers, topic}
	for p, off := range below {
		args = append(args, fmt.Sprintf("%d=%d", p, off))
	}
	out, err := runJava(ctx, "DeleteRecords.java", args...)
	if err != nil {
		return nil, fmt.Errorf("delete records: %w", err)
	}
	starts := map[int]int64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var p int
		var start int64
		if _, err := fmt.Sscan(line, &p, &start); err == nil {
			starts[p] = start
		}
	}
	return starts, nil
}

// LogOffsets reads each of topic's partitions' log start offset (below
// it, retention deleted the records) and high watermark.
func LogOffsets(ctx context.Context, brokers, topic string, partitions int) (start, end map[int]int64, err error) {
	cl := &kafka.Client{Addr: kafka.TCP(splitBrokers(brokers)...)}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	res, err := cl.ListOffsets(ctx, req)
	if err != nil {
		return nil, nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	start, end = map[int]int64{}, map[int]int64{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("list offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		start[po.Partition], end[po.Partition] = po.FirstOffset, po.LastOffset
	}
	return start, end, nil
}
