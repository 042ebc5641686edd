package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
)

// How long records wait for a topic being auto-created to appear, and how
// often its metadata is asked for meanwhile.
const (
	topicWait     = 10 * time.Second
	topicWaitStep = 250 * time.Millisecond
)

// metadataTTL is how often a topic's partitions and leaders are read again
// (from the Transport's cache, which refreshes on the same period). Nothing
// refreshes that cache after a produce error, so it must be well under the
// retry budget (kafka.max_attempts with backoff up to 1 s: about 6.5 s by
// default), or a leader change would exhaust the retries and cost a replay.
const metadataTTL = 2 * time.Second

// resolveTopics asks the cluster for the partitions and leaders of the
// topics not known yet, and of the known ones every metadataTTL (served
// from the Transport's cache). A topic being auto-created (the request asks
// for it, as the Java producer does) is waited for up to topicWait; an
// unreachable cluster is retried until the stream's delivery timeout gives
// up on the session; an answer no retry can change fails the topic's
// records at once (topicFailure). It returns how soon to try again (0:
// nothing pending).
func (p *Producer) resolveTopics(now time.Time) time.Duration {
	p.mu.Lock()
	if p.fenced != nil {
		// Nothing more will be sent: takeRound fails what waits.
		p.mu.Unlock()
		return 0
	}
	var names []string
	for name, t := range p.topics {
		if t.fetched.IsZero() || now.Sub(t.fetched) > p.metadataTTL {
			names = append(names, name)
		}
	}
	p.mu.Unlock()
	retry := time.Duration(0)
	for _, name := range names {
		mt, err := p.metadata(p.ctx, name)
		var failed []waitingRecord
		var failure error
		p.mu.Lock()
		t := p.topics[name]
		switch {
		case err == nil:
			p.applyTopic(mt, time.Now())
			for i := range t.waiting {
				w := &t.waiting[i]
				p.encode(t, &w.rec, w.now, w.ts)
			}
			t.waiting = nil
		case !t.fetched.IsZero():
			// A refresh failed: keep the known layout, try again later.
			p.log.Debug("metadata refresh failed; keeping the known partitions", "topic", name, "error", err)
			t.fetched = time.Now()
		default:
			if t.since.IsZero() {
				t.since = now
			}
			if failure = p.topicFailure(t, err); failure == nil {
				retry = topicWaitStep
				break
			}
			failed, t.waiting = t.waiting, nil
			if p.fenced == nil {
				p.fenced = fenceError(failure)
			}
		}
		p.mu.Unlock()
		if failure != nil && len(failed) > 0 {
			p.log.Error("records refused before delivery; no further records will be sent by this producer", "topic", name, "records", len(failed), "error", failure)
		}
		for i := range failed {
			// The first record carries the refusal, the later ones are
			// fenced behind it.
			err := failure
			if i > 0 {
				err = fenceError(failure)
			}
			p.failRecord(&failed[i].rec, failed[i].now, err)
		}
	}
	return retry
}

// topicFailure is the error that the records waiting for topic t get when
// its metadata answered err, or nil to ask again: at once for an answer no
// retry can change (an authorization refused, an invalid name: a
// RecordError, as the same refusal of a produce), after topicWait for a
// topic that does not appear. Called with mu held.
func (p *Producer) topicFailure(t *topic, err error) error {
	var key []byte
	if len(t.waiting) > 0 {
		key = bytes.Clone(t.waiting[0].rec.Key)
	}
	creating := errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.LeaderNotAvailable)
	switch {
	case creating && time.Since(t.since) <= p.topicWait:
		return nil
	case errors.Is(err, kafka.UnknownTopicOrPartition):
		return &RecordError{Topic: t.name, Key: key, Err: err, Reason: "the topic does not exist and the broker does not create topics (auto.create.topics.enable=false): create it"}
	case creating:
		return fmt.Errorf("kafka metadata for topic %q: %w", t.name, err)
	}
	if ae := authFailure(err); ae != nil {
		return ae
	}
	if reason := permanent(err); reason != "" {
		return &RecordError{Topic: t.name, Key: key, Err: err, Reason: reason}
	}
	p.log.Debug("kafka metadata unavailable; retrying", "topic", t.name, "error", err)
	return nil
}

// metadata asks for one topic (auto-creating it when the broker allows).
func (p *Producer) metadata(ctx context.Context, name string) (*meta.ResponseTopic, error) {
	mctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	res, err := p.rt.RoundTrip(mctx, p.bootstrap(), &meta.Request{TopicNames: []string{name}, AllowAutoTopicCreation: true})
	if err != nil {
		return nil, err
	}
	m, ok := res.(*meta.Response)
	if !ok {
		return nil, fmt.Errorf("unexpected metadata response %T", res)
	}
	p.learnBrokers(m.Brokers)
	for i := range m.Topics {
		t := &m.Topics[i]
		if t.Name != name {
			continue
		}
		if t.ErrorCode != 0 {
			return nil, kafka.Error(t.ErrorCode)
		}
		if len(t.Partitions) == 0 {
			return nil, kafka.UnknownTopicOrPartition
		}
		for _, pm := range t.Partitions {
			if pm.LeaderID < 0 {
				return nil, kafka.LeaderNotAvailable
			}
		}
		return t, nil
	}
	return nil, kafka.UnknownTopicOrPartition
}

// bootstrap is the addresses the Transport asks for metadata.
func (p *Producer) bootstrap() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// learnBrokers adds the brokers a metadata answer lists to the addresses
// the producer bootstraps from. kafka-go's Transport asks only those for
// metadata (it keeps the last layout it got when none answers), where the
// Java client asks any broker it knows: with one broker in kafka.brokers
// and that broker down, outboxd would never learn the new leaders.
func (p *Producer) learnBrokers(brokers []meta.ResponseBroker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	addrs := strings.Split(p.addr.String(), ",")
	known := map[string]bool{}
	for _, a := range addrs {
		known[a] = true
	}
	n := len(addrs)
	for _, b := range brokers {
		if a := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))); !known[a] {
			known[a] = true
			addrs = append(addrs, a)
		}
	}
	if len(addrs) > n {
		p.addr = kafka.TCP(addrs...)
		p.log.Debug("metadata from every broker the cluster lists, not only kafka.brokers", "brokers", strings.Join(addrs, ","))
	}
}

// applyTopic records a topic's layout. Called with mu held.
func (p *Producer) applyTopic(mt *meta.ResponseTopic, now time.Time) {
	t := p.topics[mt.Name]
	if t == nil {
		t = &topic{name: mt.Name, parts: map[int]*partition{}}
		p.topics[mt.Name] = t
	}
	t.fetched = now
	before := len(t.ids)
	defer func() {
		if after := len(t.ids); after != before {
			p.partitionsChanged(t.name, before, after)
		}
	}()
	for _, pm := range mt.Partitions {
		id := int(pm.PartitionIndex)
		pt := t.parts[id]
		if pt == nil {
			pt = &partition{topic: mt.Name, id: pm.PartitionIndex}
			t.parts[id] = pt
			t.ids = append(t.ids, id)
			p.parts = append(p.parts, pt)
		}
		pt.leader = pm.LeaderID
	}
	slices.Sort(t.ids)
}

// refreshLeaders rereads the leaders of the batches' topics (from the
// Transport's metadata cache) before a retry.
func (p *Producer) refreshLeaders(bs []*batch) {
	seen := map[string]bool{}
	for _, b := range bs {
		if seen[b.part.topic] {
			continue
		}
		seen[b.part.topic] = true
		mt, err := p.metadata(p.ctx, b.part.topic)
		if err != nil {
			continue
		}
		p.mu.Lock()
		p.applyTopic(mt, time.Now())
		p.mu.Unlock()
	}
}

// partitionsChanged: topic went from `from` partitions (0: first learnt) to
// `to`. Keys are hashed over the partition count, so a change moves some
// aggregates to another partition mid-stream: their earlier events stay
// in the old one, a consumer may read them after the later ones. The Java
// producer follows silently; outboxd follows loudly, or stops before any
// record takes the new layout (Config.OnPartitionChange). Called with mu
// held.
func (p *Producer) partitionsChanged(topic string, from, to int) {
	if p.cfg.Partitions != nil {
		p.cfg.Partitions(topic, from, to)
	}
	if from == 0 {
		return
	}
	if p.cfg.OnPartitionChange == PartitionsStop {
		if p.fenced == nil {
			p.fenced = fenceError(&RecordError{Topic: topic, Reason: fmt.Sprintf(
				"the topic went from %d to %d partitions while outboxd produced to it: keys are hashed over the partition count, so some aggregates would move to another partition mid-stream (kafka.on_partition_change: stop). Everything acknowledged before is confirmed; start outboxd again to go on with %d partitions (letting consumers drain the old layout first if they need an aggregate's events in order across the change), or set kafka.on_partition_change: follow",
				from, to, to)})
		}
		p.log.Error("topic partition count changed; stopping before any record takes the new layout", "topic", topic, "from", from, "to", to)
		return
	}
	p.log.Warn("topic partition count changed: keys are hashed over the new count from the next record on, so some aggregates move to another partition mid-stream (their earlier events stay in the old one; kafka.on_partition_change: stop stops instead)",
		"topic", topic, "from", from, "to", to)
}
