package preflight

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/sink"
)

const kafkaTimeout = 5 * time.Second

// brokerDial is the outcome of dialling one address.
type brokerDial struct {
	addr string
	err  error
}

// checkKafka dials every broker as outboxd dials (sc: client id, TLS,
// SASL), so that a port that accepts TCP but does not speak Kafka is not
// counted and a TLS or SASL failure is named as such.
func checkKafka(ctx context.Context, cfg target, sc sink.Config) []Result {
	var dials []brokerDial
	var conn *kafka.Conn
	for _, addr := range cfg.Kafka.Brokers {
		c, err := sink.Dial(ctx, sc, addr)
		dials = append(dials, brokerDial{addr, err})
		if err == nil {
			if conn == nil {
				conn = c
			} else {
				c.Close()
			}
		}
	}
	topics, templates := routeTopics(cfg.routing)
	if conn == nil {
		out := []Result{evalKafka(dials, nil)}
		for _, t := range append(topics, templates...) {
			out = append(out, skipped("topic "+t, "no broker is reachable"))
		}
		return out
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(kafkaTimeout))
	// The addresses the cluster advertises are the ones producers use after
	// bootstrapping: a wrong advertised.listeners passes the bootstrap dial
	// and fails every produce.
	var advertised []brokerDial
	brokers, err := conn.Brokers()
	if err != nil {
		advertised = append(advertised, brokerDial{"(cluster metadata)", err})
	}
	for _, b := range brokers {
		addr := net.JoinHostPort(b.Host, strconv.Itoa(b.Port))
		c, err := sink.Dial(ctx, sc, addr)
		if err == nil {
			c.Close()
		}
		advertised = append(advertised, brokerDial{addr, err})
	}
	out := []Result{evalKafka(dials, advertised)}
	var probe error
	if cfg.Kafka.Idempotence {
		probe = sink.ProbeIdempotence(ctx, sc)
	}
	out = append(out, evalIdempotence(cfg.Kafka.Idempotence, probe))
	out = append(out, transactionsLine(ctx, cfg, sc))

	// All topics, not the routed ones by name: a metadata request naming a
	// topic may make the broker create it.
	_ = conn.SetDeadline(time.Now().Add(kafkaTimeout))
	parts, err := conn.ReadPartitions()
	if err != nil {
		for _, t := range topics {
			out = append(out, fail("topic "+t, "cannot read the cluster's topics: "+err.Error(), "check the broker's logs and ACLs (Describe on the topic)"))
		}
		return out
	}
	count := map[string]int{}
	for _, p := range parts {
		count[p.Topic]++
	}
	var existing []string
	for _, t := range topics {
		out = append(out, evalTopic(t, count[t], producerCreatesTopics))
		if count[t] > 0 {
			existing = append(existing, t)
		}
	}
	for _, t := range templates {
		out = append(out, evalTemplate(t))
	}
	return append(out, dedupeLine(ctx, cfg.Config, sc, existing))
}

// routeTopics lists the fixed topics of the routes (their topics, their
// overrides' and fallbacks) and, apart, the templates, whose topics depend
// on the rows.
func routeTopics(m envelope.Routing) (topics, templates []string) {
	seen := map[string]bool{}
	add := func(t string) {
		if t == "" || seen[t] {
			return
		}
		seen[t] = true
		if tm, err := envelope.ParseTemplate(t); err == nil && !tm.Static() {
			templates = append(templates, t)
		} else {
			topics = append(topics, t)
		}
	}
	for _, r := range m.Routes {
		add(r.Topic)
		for _, o := range r.Overrides {
			add(o.Topic)
		}
		add(r.TopicFallback)
	}
	return topics, templates
}

// evalTemplate is the line of a topic template: its topics are known only
// from the rows.
func evalTemplate(t string) Result {
	return pass("topic "+t, "a template: one topic per value; each must exist, or the broker creates it if its auto.create.topics.enable is true (create them beforehand to choose their partitions)")
}

// evalKafka passes when every configured broker and every broker the cluster
// advertises answers.
func evalKafka(bootstrap, advertised []brokerDial) Result {
	var ok, bad []string
	security := ""
	for _, d := range bootstrap {
		if d.err != nil {
			why := sink.Explain(d.err)
			// The fix says why once; the detail keeps the error itself.
			bad = append(bad, strings.TrimPrefix(d.err.Error(), why+": "))
			if why != "" && security == "" {
				security = why
			}
		} else {
			ok = append(ok, d.addr)
		}
	}
	if len(bad) > 0 {
		fix := "check kafka.brokers (host:port of the broker's listener) and that the broker runs and accepts connections from here"
		if security != "" {
			// The broker answers, but refuses outboxd's TLS or SASL.
			fix = security
		}
		return fail("kafka", fmt.Sprintf("%d of %d brokers reachable: %s", len(ok), len(bootstrap), strings.Join(bad, "; ")), fix)
	}
	var advOK, advBad []string
	for _, d := range advertised {
		if d.err != nil {
			advBad = append(advBad, d.err.Error())
		} else {
			advOK = append(advOK, d.addr)
		}
	}
	if len(advBad) > 0 {
		return fail("kafka", fmt.Sprintf("the bootstrap brokers answer, but %d of %d brokers the cluster advertises do not: %s", len(advBad), len(advertised), strings.Join(advBad, "; ")),
			"set the brokers' advertised.listeners to addresses reachable from here")
	}
	sort.Strings(advOK)
	return pass("kafka", "%d of %d brokers reachable (%s); cluster advertises %s", len(ok), len(bootstrap), strings.Join(ok, ", "), strings.Join(advOK, ", "))
}

// evalIdempotence is the line of kafka.idempotence: whether the brokers
// gave a producer id to outboxd's principal (probe: sink.ProbeIdempotence),
// as outboxd asks at its first record.
func evalIdempotence(enabled bool, probe error) Result {
	const name = "kafka idempotence"
	var ie *sink.IdempotenceError
	switch {
	case !enabled:
		return pass(name, "off (kafka.idempotence: false): a retry after a lost acknowledgement may duplicate records")
	case probe == nil:
		return pass(name, "the brokers give outboxd a producer id: a retried batch is never appended twice")
	case errors.As(probe, &ie):
		return fail(name, ie.Why+" ("+oneLine(ie.Err.Error())+")", ie.Fix)
	}
	return warn(name, "could not ask the brokers for a producer id: "+oneLine(probe.Error()),
		"check the brokers' logs (outboxd asks again at its first record, and stops if they refuse)")
}

// transactionsLine is the line of kafka.transactions: whether the
// brokers name a coordinator for the transactional id to outboxd's
// principal (sink.ProbeTransactions; DESCRIBE on the id). WRITE on it is
// asked at the first record, by InitProducerId, which check does not
// send: it would fence an outboxd running with the id.
func transactionsLine(ctx context.Context, cfg target, sc sink.Config) Result {
	if !cfg.Kafka.Transactions {
		return evalTransactions(false, "", -1, nil)
	}
	if cfg.Kafka.TransactionalID == "" && cfg.system == "" {
		return skipped("kafka transactions", "the database's system identifier, which the transactional id names, was not read")
	}
	id := cfg.TransactionalID(cfg.system)
	node, err := sink.ProbeTransactions(ctx, sc, id)
	return evalTransactions(true, id, node, err)
}

func evalTransactions(enabled bool, id string, node int32, probe error) Result {
	const name = "kafka transactions"
	var ie *sink.IdempotenceError
	switch {
	case !enabled:
		return pass(name, "off (kafka.transactions: false): records are visible at once; an outboxd frozen while another took its slot over may produce again what it held (docs/guarantees.md)")
	case probe == nil:
		return pass(name, "transactional id %s, coordinator broker %d (the principal needs WRITE on it too, asked at the first record)", id, node)
	case errors.As(probe, &ie):
		return fail(name, ie.Why+" ("+oneLine(ie.Err.Error())+")", ie.Fix)
	}
	return warn(name, "no coordinator for transactional id "+id+": "+oneLine(probe.Error()),
		"check the brokers' logs and transaction.state.log settings (outboxd asks again at its first record)")
}

// producerCreatesTopics says whether outboxd's producer asks the broker to
// create a missing topic. sink's metadata requests set AllowAutoTopicCreation
// and wait for a topic being created (TestMissingTopicAutoCreated), so the
// broker's auto.create.topics.enable decides.
const producerCreatesTopics = true

func evalTopic(topic string, partitions int, producerCreates bool) Result {
	if partitions > 0 {
		return pass("topic "+topic, "exists, %d partition(s)", partitions)
	}
	if producerCreates {
		return pass("topic "+topic, "does not exist; will be created if the broker's auto.create.topics.enable is true (outboxd cannot read that broker setting cheaply: create the topic beforehand to choose its partitions and be sure)")
	}
	return fail("topic "+topic, "does not exist, and outboxd's producer does not ask the broker to create topics (whatever auto.create.topics.enable says): the first event routed to it would stop outboxd",
		fmt.Sprintf("create it first, e.g. kafka-topics.sh --create --topic %s --partitions N --replication-factor 3", topic))
}

// dedupeLine is the line of kafka.deduplicate: whether a session can read
// the tails of the routed topics that exist (sink.ProbeTail: READ on them).
func dedupeLine(ctx context.Context, cfg config.Config, sc sink.Config, topics []string) Result {
	probes := map[string]error{}
	if cfg.Kafka.Deduplicate && cfg.Kafka.Idempotence {
		for _, t := range topics {
			probes[t] = sink.ProbeTail(ctx, sc, t)
		}
	}
	return evalDedupe(cfg.Kafka.Deduplicate, cfg.Kafka.Idempotence, probes)
}

// streamKeyLine is the line of kafka.stream_key_file: whether run finds
// the key that signs the records' stream headers, or can make it
// (sink.CheckStreamKey).
func streamKeyLine(cfg config.Config) Result {
	if !cfg.Kafka.Deduplicate || !cfg.Kafka.Idempotence {
		return pass(streamKeyName, "not used (no restart de-duplication)")
	}
	path := cfg.Kafka.StreamKeyFile
	var exists bool
	var err error
	if path != "" {
		exists, err = sink.CheckStreamKey(path)
	}
	return evalStreamKey(path, exists, err)
}

const streamKeyName = "kafka stream key"

// evalStreamKey judges kafka.stream_key_file from its path and what
// sink.CheckStreamKey said of it.
func evalStreamKey(path string, exists bool, err error) Result {
	const degraded = "outboxd would sign with a key of its process alone: after each restart it produces again what the slot had not confirmed (duplicates, never a loss)"
	switch {
	case path == "":
		return warn(streamKeyName, "kafka.stream_key_file is empty: "+degraded, "name a file every instance of the slot shares (docs/guarantees.md)")
	case errors.Is(err, sink.ErrStreamKeyNotKept):
		return warn(streamKeyName, path+" does not exist and cannot be made ("+oneLine(err.Error())+"): "+degraded,
			"make its directory writable, or put there a key every instance of the slot shares (openssl rand -hex 32)")
	case err != nil:
		return fail(streamKeyName, oneLine(err.Error())+": outboxd run would stop", "replace it with a key of at least 16 bytes (openssl rand -hex 32) every instance of the slot shares")
	case exists:
		return pass(streamKeyName, "%s (every instance of the slot must have the same one)", path)
	}
	return pass(streamKeyName, "%s does not exist yet: the first start makes it (every instance of the slot must have the same one)", path)
}

// evalDedupe judges restart de-duplication from whether it is on, whether
// the producer is idempotent, and each topic's tail probe.
func evalDedupe(enabled, idempotent bool, probes map[string]error) Result {
	const name = "kafka deduplicate"
	switch {
	case !enabled:
		return pass(name, "off (kafka.deduplicate: false): a restart produces again what the slot had not confirmed")
	case !idempotent:
		return warn(name, "on, but kafka.idempotence is off: nothing is skipped after a restart (a partition may hold a later record without an earlier one)",
			"set kafka.idempotence: true, or kafka.deduplicate: false to say so")
	}
	var denied, failed []string
	for _, t := range slices.Sorted(maps.Keys(probes)) {
		switch err := probes[t]; {
		case errors.Is(err, kafka.TopicAuthorizationFailed):
			denied = append(denied, t)
		case err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition):
			failed = append(failed, t+" ("+oneLine(err.Error())+")")
		}
	}
	switch {
	case len(denied) > 0:
		return warn(name, "outboxd's principal may not READ "+strings.Join(denied, ", ")+": a restart cannot see what those topics hold, and produces it again",
			"grant READ on them, e.g. kafka-acls.sh --bootstrap-server BROKER --add --allow-principal User:outboxd --operation Read --topic "+denied[0])
	case len(failed) > 0:
		return warn(name, "could not read the tail of "+strings.Join(failed, ", "), "check the brokers' logs (outboxd reads the tails again at each session's start)")
	}
	return pass(name, "on: a restart reads each partition's tail and does not produce again what it holds (%d topic(s) readable)", len(probes))
}
