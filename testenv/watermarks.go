package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"github.com/segmentio/kafka-go/protocol/metadata"
)

// watermarks reads a topic's high watermarks from every broker itself, not
// through a client's cached layout. A kafka-go client asks for the layout
// over one connection; when that broker is cut off from the others (chaos
// 8d) it keeps calling itself the leader, and its frozen high watermark
// made the LSN check report confirmations past records the real leader had
// acknowledged. Each partition's answer is the one with the highest leader
// epoch (the current leader's), the highest offset among equals: a stale
// leader's watermark is never above the committed one, so the check stays
// strict.
type watermarks struct {
	mu        sync.Mutex // one reader at a time: the sampler and the drain wait share it
	bootstrap []string
	brokers   []string // learnt from a metadata answer; nil: ask again
	conns     map[string]*protocol.Conn
}

func newWatermarks(bootstrap []string) *watermarks {
	return &watermarks{bootstrap: bootstrap, conns: map[string]*protocol.Conn{}}
}

func (w *watermarks) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for a, c := range w.conns {
		c.Close()
		delete(w.conns, a)
	}
}

// read returns the high watermark of each of the topic's partitions.
func (w *watermarks) read(ctx context.Context, topic string, partitions int, timeout time.Duration) (map[int]int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if w.brokers == nil {
		if err := w.learnBrokers(topic, deadline); err != nil {
			return nil, err
		}
	}
	req := &listoffsets.Request{ReplicaID: -1, Topics: []listoffsets.RequestTopic{{Topic: topic}}}
	for p := range partitions {
		req.Topics[0].Partitions = append(req.Topics[0].Partitions,
			listoffsets.RequestPartition{Partition: int32(p), CurrentLeaderEpoch: -1, Timestamp: -1})
	}
	hw, epoch := map[int]int64{}, map[int]int32{}
	for _, addr := range w.brokers {
		res, err := w.roundTrip(addr, req, deadline)
		if err != nil {
			continue // a broker down answers for nothing
		}
		for _, t := range res.(*listoffsets.Response).Topics {
			for _, pa := range t.Partitions {
				p := int(pa.Partition)
				if t.Topic != topic || pa.ErrorCode != 0 {
					continue
				}
				if e, seen := epoch[p]; !seen || pa.LeaderEpoch > e || pa.LeaderEpoch == e && pa.Offset > hw[p] {
					hw[p], epoch[p] = pa.Offset, pa.LeaderEpoch
				}
			}
		}
	}
	if len(hw) != partitions {
		w.brokers = nil // the cluster may have changed: learn it again
		return nil, fmt.Errorf("%d of %d partitions of %s answered", len(hw), partitions, topic)
	}
	return hw, nil
}

// learnBrokers asks the bootstrap addresses, in turn, for the cluster's
// brokers.
func (w *watermarks) learnBrokers(topic string, deadline time.Time) error {
	var last error
	for _, addr := range w.bootstrap {
		res, err := w.roundTrip(addr, &metadata.Request{TopicNames: []string{topic}}, deadline)
		if err != nil {
			last = err
			continue
		}
		w.brokers = nil
		for _, b := range res.(*metadata.Response).Brokers {
			w.brokers = append(w.brokers, net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))))
		}
		return nil
	}
	return fmt.Errorf("no broker of %v answered for the cluster's brokers: %w", w.bootstrap, last)
}

func (w *watermarks) roundTrip(addr string, req protocol.Message, deadline time.Time) (protocol.Message, error) {
	c := w.conns[addr]
	if c == nil {
		nc, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			return nil, err
		}
		c = protocol.NewConn(nc, "outboxd-verifier")
		// Versions every Kafka since 2.1 serves, 4.x included.
		c.SetVersions(map[protocol.ApiKey]int16{protocol.Metadata: 8, protocol.ListOffsets: 4})
		w.conns[addr] = c
	}
	_ = c.SetDeadline(deadline)
	res, err := c.RoundTrip(req)
	if err != nil {
		c.Close()
		delete(w.conns, addr)
		return nil, err
	}
	return res, nil
}
