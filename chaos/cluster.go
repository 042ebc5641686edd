package chaos

import (
	"fmt"
	"net"
	"os"

	"github.com/outboxd/outboxd/testenv"
)

// clusterBrokers is the size of the cluster scenarios' Kafka cluster.
const clusterBrokers = 3

// ClusterEnv is a Kafka cluster of three brokers and a KRaft controller
// apart (testenv, kafka-cluster.sh), with a proxy on every path from one
// broker to another and from each broker to the controller: a broker can
// be cut off from the others (Isolate) while clients still reach it.
// Clients (outboxd, the verifier) connect to the brokers directly.
type ClusterEnv struct {
	*testenv.Env
	links map[path]*Proxy
}

// path is a connection's direction: from broker `from` to broker `to`, or
// to the controller when `to` is 0.
type path struct{ from, to int }

// StartCluster starts the cluster and its proxies.
//
// Broker k reaches broker j through the proxy (k, j): every broker has a
// listener Rk for each broker k, advertised at that proxy, and broker k's
// inter-broker listener is Rk. Each proxy's port is bound before the
// cluster starts, since the brokers advertise it; its target (the port
// kafka.sh picks) is read when a connection comes.
func StartCluster() (*ClusterEnv, error) {
	dir, err := os.MkdirTemp("", "outboxd-cluster-")
	if err != nil {
		return nil, err
	}
	c := &ClusterEnv{links: map[path]*Proxy{}}
	fail := func(err error) (*ClusterEnv, error) {
		c.closeProxies()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cd := testenv.ClusterDir(dir)
	opts := testenv.Options{NoPostgres: true, Dir: dir, KafkaNodes: clusterBrokers, Brokers: map[int]testenv.BrokerOptions{}}
	proxy := func(p path, target func() (string, error)) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		c.links[p] = newLazyProxy(ln, target)
		return ln.Addr().String(), nil
	}
	for k := 1; k <= clusterBrokers; k++ {
		addr, err := proxy(path{k, 0}, cd.Controller)
		if err != nil {
			return fail(err)
		}
		b := opts.Brokers[k]
		b.InterBrokerListener, b.ControllerAddr = listenerName(k), addr
		opts.Brokers[k] = b
	}
	for j := 1; j <= clusterBrokers; j++ {
		for k := 1; k <= clusterBrokers; k++ {
			name := listenerName(k)
			addr, err := proxy(path{k, j}, func() (string, error) { return cd.Listener(j, name) })
			if err != nil {
				return fail(err)
			}
			b := opts.Brokers[j]
			b.Listeners = append(b.Listeners, testenv.Listener{Name: name, Advertise: addr})
			opts.Brokers[j] = b
		}
	}
	if c.Env, err = testenv.Start(opts); err != nil {
		return fail(err)
	}
	return c, nil
}

// listenerName is the listener broker k reaches the others on.
func listenerName(k int) string { return fmt.Sprintf("R%d", k) }

// Isolate cuts broker id off from the other brokers and from the
// controller, both ways: no byte passes, no connection closes (a network
// partition). Clients still reach it.
func (c *ClusterEnv) Isolate(id int) {
	for p, x := range c.links {
		if p.from == id || p.to == id {
			x.Blackhole()
		}
	}
}

// Heal ends every isolation.
func (c *ClusterEnv) Heal() {
	for _, x := range c.links {
		x.Heal()
	}
}

func (c *ClusterEnv) closeProxies() {
	for _, x := range c.links {
		x.Close()
	}
}

// Close stops and removes the cluster and its proxies.
func (c *ClusterEnv) Close() {
	c.Env.Cleanup()
	c.closeProxies()
}
