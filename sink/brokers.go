package sink

import (
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	meta "github.com/segmentio/kafka-go/protocol/metadata"
)

// avoidFor is how long a broker that did not answer a produce request is
// not asked for the cluster's layout (avoidBroker).
const avoidFor = time.Minute

// bootstrap is the addresses the Transport asks for metadata: every broker
// known but those avoided (all of them when every one is). The Transport
// keeps one pool of connections per address list; when the list changes,
// the old pools go (their control connection with them).
func (p *Producer) bootstrap() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	boot := p.addr
	if len(p.avoid) > 0 {
		boot = p.unavoided(p.clock.Now())
	}
	if p.boot != nil && boot.String() != p.boot.String() && p.transport != nil {
		p.transport.CloseIdleConnections()
	}
	p.boot = boot
	return boot
}

// unavoided is p.addr without the brokers avoided at now, or p.addr when
// that leaves none. Called with mu held.
func (p *Producer) unavoided(now time.Time) net.Addr {
	avoided := map[string]bool{}
	for id, until := range p.avoid {
		if now.Before(until) {
			avoided[p.brokerAddrs[id]] = true
		} else {
			delete(p.avoid, id)
		}
	}
	var asked []string
	for _, a := range strings.Split(p.addr.String(), ",") {
		if !avoided[a] {
			asked = append(asked, a)
		}
	}
	if len(asked) == 0 || len(avoided) == 0 {
		return p.addr
	}
	return kafka.TCP(asked...)
}

// avoidBroker stops asking broker id for the cluster's layout for a while
// after a produce request to it got no answer (err). kafka-go's Transport
// reads the layout over one connection, to a broker of the bootstrap list
// picked at random, and routes every produce request by it: a leader cut
// off from the other brokers but not from outboxd goes on calling itself
// the leader after the others elected new ones (chaos 8d), and outboxd
// would retry into it until the cut heals. Asked the other brokers, the
// Transport learns the new leaders within a metadata round trip. Called
// with mu held.
func (p *Producer) avoidBroker(id int32, err error, now time.Time) {
	if id < 0 || p.brokerAddrs[id] == "" {
		return
	}
	if until, ok := p.avoid[id]; ok && now.Before(until) {
		return
	}
	if p.avoid == nil {
		p.avoid = map[int32]time.Time{}
	}
	p.avoid[id] = now.Add(avoidFor)
	p.log.Info("a broker did not answer a produce request: reading the cluster's layout from the other brokers for a while", "broker", id, "address", p.brokerAddrs[id], "for", avoidFor, "error", err)
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
	if p.brokerAddrs == nil {
		p.brokerAddrs = map[int32]string{}
	}
	for _, b := range brokers {
		a := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		p.brokerAddrs[b.NodeID] = a
		if !known[a] {
			known[a] = true
			addrs = append(addrs, a)
		}
	}
	if len(addrs) > n {
		p.addr = kafka.TCP(addrs...)
		p.log.Debug("metadata from every broker the cluster lists, not only kafka.brokers", "brokers", strings.Join(addrs, ","))
	}
}
