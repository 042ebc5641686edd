package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/describeconfigs"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
)

// How long a topic the cluster calls missing is asked for before the
// producer concludes anything, counted from the first answer that said so
// after the cluster last failed to answer (not from the first request: a
// broker that has just restarted, or whose controller is away, answers
// UNKNOWN_TOPIC_OR_PARTITION for a topic it is about to create), the fewest
// such answers, and how often its metadata is asked for meanwhile. The wait
// must stay well under kafka.delivery_timeout, which ends the session.
const (
	topicWait        = 10 * time.Second
	topicWaitAnswers = 3
	topicWaitStep    = 250 * time.Millisecond
)

// metadataTTL is how often a topic's partitions and leaders are read again
// (from the Transport's cache, which refreshes on the same period). Nothing
// refreshes that cache after a produce error, so it must be well under the
// retry budget (kafka.max_attempts with backoff up to 1 s: at most about 6.5 s by
// default), or a leader change would exhaust the retries and cost a replay.
const metadataTTL = 2 * time.Second

// resolveTopics asks the cluster for the partitions and leaders of the
// topics not known yet, and of the known ones every metadataTTL and after
// a batch of theirs failed (served from the Transport's cache). A topic being auto-created (the request asks
// for it, as the Java producer does) is waited for (topicFailure); an
// unreachable cluster is retried until the stream's delivery timeout gives
// up on the session; an answer no retry can change fails the topic's
// records at once. It returns how soon to try again (0: nothing pending).
func (p *Producer) resolveTopics(now time.Time) time.Duration {
	p.mu.Lock()
	if p.fenced != nil {
		// Nothing more will be sent: takeRound fails what waits.
		p.mu.Unlock()
		return 0
	}
	var names []string
	for name, t := range p.topics {
		if t.fetched.IsZero() || t.stale || now.Sub(t.fetched) > p.metadataTTL {
			names = append(names, name)
			t.stale = false
		}
	}
	p.mu.Unlock()
	retry := time.Duration(0)
	for _, name := range names {
		mt, brokers, err := p.metadata(p.ctx, name)
		if missingTopic(err) && brokers != nil && p.autoCreate == nil {
			p.autoCreate = p.readAutoCreation(brokers)
		}
		var failed []waitingRecord
		var failure error
		p.mu.Lock()
		t := p.topics[name]
		switch {
		case err == nil:
			p.applyTopic(mt, p.clock.Now())
			for i := range t.waiting {
				w := &t.waiting[i]
				p.encode(t, &w.rec, w.now, w.ts)
			}
			t.waiting = nil
		case !t.fetched.IsZero():
			// A refresh failed: keep the known layout, try again later.
			p.log.Debug("metadata refresh failed; keeping the known partitions", "topic", name, "error", err)
			t.fetched = p.clock.Now()
		default:
			if failure = p.topicFailure(t, err, brokers != nil, now); failure == nil {
				retry = topicWaitStep
				break
			}
			failed, t.waiting = t.waiting, nil
			if p.fenced == nil {
				p.fenced = fenceError(failure)
			}
		}
		p.mu.Unlock()
		// Returned, not logged: each record's Acker gets the failure,
		// which ends the stream (the runner logs it once).
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
// its metadata answered err (answered: a broker that knows the cluster
// answered), or nil to ask again. An answer no retry can change (an
// authorization refused, an invalid name) fails them at once, as a
// RecordError like the same refusal of a produce. A topic the cluster calls
// missing is only concluded missing from evidence that holds: topicWait
// and topicWaitAnswers answers since the cluster answered again, and then
// what the brokers' configuration says (readAutoCreation): a broker that
// does not create topics, or whose configuration cannot be read, means the
// topic does not exist (a RecordError: outboxd stops with the fix); one
// that does create them means an outage (the controller away, ...): the
// records fail with a retriable error that says so, and the session is
// retried after the backoff. Called with mu held.
func (p *Producer) topicFailure(t *topic, err error, answered bool, now time.Time) error {
	var key []byte
	if len(t.waiting) > 0 {
		key = bytes.Clone(t.waiting[0].rec.Key)
	}
	missing := missingTopic(err)
	if !missing {
		if ae := authFailure(err); ae != nil {
			return ae
		}
		// UNKNOWN_SERVER_ERROR for the topic is the broker failing to
		// answer for it, not a refusal: Kafka 2.x with ZooKeeper answers so
		// while it cannot reach ZooKeeper to create the topic. Asked again,
		// as the Java producer waits for a topic's metadata whatever its
		// error (max.block.ms).
		if reason := permanent(err); reason != "" && !errors.Is(err, kafka.Unknown) {
			return &RecordError{Topic: t.name, Key: key, Err: err, Reason: reason}
		}
	}
	if !answered {
		// No broker answered (down, restarting, unreachable), or one that
		// does not know the cluster yet: what comes after says nothing of
		// what came before.
		t.missingSince, t.missingAnswers = time.Time{}, 0
	}
	if !missing || !answered {
		p.log.Debug("kafka metadata unavailable; retrying", "topic", t.name, "error", err)
		return nil
	}
	if t.missingSince.IsZero() {
		t.missingSince = now
	}
	t.missingAnswers++
	waited := now.Sub(t.missingSince)
	if waited < p.topicWait || t.missingAnswers < topicWaitAnswers {
		return nil
	}
	observed := fmt.Sprintf("the brokers answered %s to %d metadata requests that asked for its creation, over %s from their first answer",
		codeName(err), t.missingAnswers, waited.Round(100*time.Millisecond))
	ac := p.autoCreate
	switch {
	case errors.Is(err, kafka.LeaderNotAvailable):
		return fmt.Errorf("kafka metadata for topic %q: the topic has no leader (%s): %w", t.name, observed, err)
	case ac != nil && ac.known && ac.on:
		return fmt.Errorf("kafka metadata for topic %q: the brokers create topics (auto.create.topics.enable=true %s) but have not created it (%s): the controller may be unavailable; retrying: %w",
			t.name, ac.source, observed, err)
	case ac != nil && ac.known:
		return &RecordError{Topic: t.name, Key: key, Err: err, Reason: fmt.Sprintf(
			"the topic does not exist (%s) and the broker does not create topics (auto.create.topics.enable=false %s): create it", observed, ac.source)}
	}
	why := "not read"
	if ac != nil {
		why = ac.source
	}
	return &RecordError{Topic: t.name, Key: key, Err: err, Reason: fmt.Sprintf(
		"the topic does not exist (%s; whether the brokers create topics is unknown: their configuration %s): create it, or let the brokers create topics (auto.create.topics.enable=true)", observed, why)}
}

// missingTopic says whether err is a metadata answer in which the topic has
// no usable layout yet: unknown, or without a leader (being created).
func missingTopic(err error) bool {
	return errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.LeaderNotAvailable)
}

// autoCreation is what the brokers' configuration says of
// auto.create.topics.enable.
type autoCreation struct {
	known  bool   // read from every broker the cluster lists
	on     bool   // every one of them creates topics
	source string // where it was read ("in the configuration of brokers 1, 2"), or why it was not
}

// readAutoCreation asks brokers for their auto.create.topics.enable through
// DescribeConfigs (it needs DESCRIBE_CONFIGS on the cluster). It returns nil
// when the brokers did not answer (ask again later), an autoCreation that
// is not known when they refused or do not say.
func (p *Producer) readAutoCreation(brokers []int32) *autoCreation {
	req := &describeconfigs.Request{}
	for _, id := range brokers {
		req.Resources = append(req.Resources, describeconfigs.RequestResource{
			ResourceType: resourceBroker, ResourceName: strconv.Itoa(int(id)), ConfigNames: []string{"auto.create.topics.enable"}})
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.WriteTimeout)
	defer cancel()
	res, err := p.rt.RoundTrip(ctx, p.bootstrap(), req)
	if err != nil {
		var kerr kafka.Error
		if errors.As(err, &kerr) {
			return &autoCreation{source: "could not be read (" + kerr.Title() + ")"}
		}
		p.log.Debug("reading the brokers' auto.create.topics.enable failed; asking again later", "error", err)
		return nil
	}
	dr, ok := res.(*describeconfigs.Response)
	if !ok {
		return &autoCreation{source: fmt.Sprintf("could not be read (unexpected answer %T)", res)}
	}
	on, off := []string{}, []string{}
	for _, r := range dr.Resources {
		if r.ErrorCode != 0 {
			return &autoCreation{source: fmt.Sprintf("could not be read from broker %s (%s)", r.ResourceName, kafka.Error(r.ErrorCode).Title())}
		}
		for _, e := range r.ConfigEntries {
			switch {
			case e.ConfigName != "auto.create.topics.enable":
			case e.ConfigValue == "true":
				on = append(on, r.ResourceName)
			case e.ConfigValue == "false":
				off = append(off, r.ResourceName)
			}
		}
	}
	ac := &autoCreation{known: true}
	switch {
	case len(off) > 0:
		ac.source = "in the configuration of " + brokerList(off)
	case len(on) == len(brokers):
		ac.on, ac.source = true, "in the configuration of "+brokerList(on)
	default:
		return &autoCreation{source: "was not in the brokers' answer"}
	}
	return ac
}

// resourceBroker is DescribeConfigs' resource type of a broker.
const resourceBroker = 4

func brokerList(ids []string) string {
	if len(ids) == 1 {
		return "broker " + ids[0]
	}
	return "brokers " + strings.Join(ids, ", ")
}

// metadata asks for one topic (auto-creating it when the broker allows).
// brokers is the cluster's broker ids as the answer lists them, nil when no
// broker answered or the one that did does not know the cluster yet (no
// broker and no controller in its answer: a ZooKeeper-mode broker before
// the controller sent it the cluster's state, whose "unknown topic" says
// nothing about the topic).
func (p *Producer) metadata(ctx context.Context, name string) (*meta.ResponseTopic, []int32, error) {
	mctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	res, err := p.rt.RoundTrip(mctx, p.bootstrap(), &meta.Request{TopicNames: []string{name}, AllowAutoTopicCreation: true})
	if err != nil {
		return nil, nil, err
	}
	m, ok := res.(*meta.Response)
	if !ok {
		return nil, nil, fmt.Errorf("unexpected metadata response %T", res)
	}
	p.learnBrokers(m.Brokers)
	var brokers []int32
	if len(m.Brokers) > 0 && m.ControllerID >= 0 {
		for _, b := range m.Brokers {
			brokers = append(brokers, b.NodeID)
		}
	}
	for i := range m.Topics {
		t := &m.Topics[i]
		if t.Name != name {
			continue
		}
		if t.ErrorCode != 0 {
			return nil, brokers, kafka.Error(t.ErrorCode)
		}
		if len(t.Partitions) == 0 {
			return nil, brokers, kafka.UnknownTopicOrPartition
		}
		for _, pm := range t.Partitions {
			if pm.LeaderID < 0 {
				return nil, brokers, kafka.LeaderNotAvailable
			}
		}
		return t, brokers, nil
	}
	return nil, brokers, kafka.UnknownTopicOrPartition
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
			t.resized = t.resized || before != 0
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
		if pt.leader != pm.LeaderID {
			// A new leader: one batch at a time until it acknowledges one.
			pt.leader, pt.pipelined = pm.LeaderID, false
		}
	}
	slices.Sort(t.ids)
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
		// Returned, not logged: the records waiting and every later one
		// fail with it, which ends the stream (the runner logs it once).
		return
	}
	p.log.Warn("topic partition count changed: keys are hashed over the new count from the next record on, so some aggregates move to another partition mid-stream (their earlier events stay in the old one; kafka.on_partition_change: stop stops instead)",
		"topic", topic, "from", from, "to", to)
}
