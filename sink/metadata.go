package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
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
		if t.fetched.IsZero() || now.Sub(t.fetched) > metadataTTL {
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
	res, err := p.rt.RoundTrip(mctx, p.addr, &meta.Request{TopicNames: []string{name}, AllowAutoTopicCreation: true})
	if err != nil {
		return nil, err
	}
	m, ok := res.(*meta.Response)
	if !ok {
		return nil, fmt.Errorf("unexpected metadata response %T", res)
	}
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

// applyTopic records a topic's layout. Called with mu held.
func (p *Producer) applyTopic(mt *meta.ResponseTopic, now time.Time) {
	t := p.topics[mt.Name]
	if t == nil {
		t = &topic{name: mt.Name, parts: map[int]*partition{}}
		p.topics[mt.Name] = t
	}
	t.fetched = now
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
