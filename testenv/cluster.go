package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// A Kafka cluster (Options.KafkaNodes > 1): brokers 1..n and a KRaft
// controller (node 0) apart from them, started by kafka-cluster.sh. Topics
// get replication factor 3 (fewer with fewer brokers) and
// min.insync.replicas 2; unclean leader election is off.

// BrokerOptions are one broker's settings in a cluster, to put a proxy
// between it and the others.
type BrokerOptions struct {
	Listeners []Listener // extra client listeners of this broker
	// InterBrokerListener is the listener (one of every broker's Listeners)
	// this broker reaches the other brokers on; "" is PLAINTEXT, direct.
	InterBrokerListener string
	// ControllerAddr is where this broker reaches the controller
	// (host:port); "" is the controller's own address.
	ControllerAddr string
}

// clusterEnviron is kafka-cluster.sh's settings for a first start.
func (o Options) clusterEnviron() ([]string, error) {
	if o.KafkaNodes <= 1 {
		if len(o.Brokers) > 0 {
			return nil, fmt.Errorf("testenv: Options.Brokers needs KafkaNodes > 1")
		}
		return nil, nil
	}
	if len(o.Listeners) > 0 {
		return nil, fmt.Errorf("testenv: a cluster takes per-broker listeners (Options.Brokers), not Options.Listeners")
	}
	out := []string{"KAFKA_NODES=" + strconv.Itoa(o.KafkaNodes)}
	for id, b := range o.Brokers {
		if id < 1 || id > o.KafkaNodes {
			return nil, fmt.Errorf("testenv: Options.Brokers: no broker %d in a cluster of %d", id, o.KafkaNodes)
		}
		ls, err := listenerSpec(b.Listeners)
		if err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprintf("KAFKA_LISTENERS_%d=%s", id, ls),
			fmt.Sprintf("KAFKA_INTER_BROKER_LISTENER_%d=%s", id, b.InterBrokerListener),
			fmt.Sprintf("KAFKA_CONTROLLER_ADDR_%d=%s", id, b.ControllerAddr))
	}
	return out, nil
}

// cluster reads kafka-cluster.sh's kafka.env; nil for a single broker.
func (e *Env) cluster() (map[string]string, error) {
	if _, err := os.Stat(filepath.Join(e.Dir, "kafka-cluster.env")); err != nil {
		return nil, nil
	}
	return readEnvFile(filepath.Join(e.Dir, "kafka.env"))
}

// replicationFactor is what Env.CreateTopic gives a topic: 3 on a cluster
// of three (min.insync.replicas 2), 1 on a single broker.
func (e *Env) replicationFactor() int {
	m, err := readEnvFile(filepath.Join(e.Dir, "kafka-cluster.env"))
	if err != nil {
		return 1
	}
	if rf, err := strconv.Atoi(m["RF"]); err == nil && rf > 0 {
		return rf
	}
	return 1
}

// Brokers lists the cluster's broker ids (1..n); a single broker is [1].
func (e *Env) Brokers() ([]int, error) {
	m, err := e.cluster()
	if err != nil || m == nil {
		return []int{1}, err
	}
	n, err := strconv.Atoi(m["KAFKA_NODES"])
	if err != nil {
		return nil, fmt.Errorf("testenv: kafka.env: KAFKA_NODES: %w", err)
	}
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i + 1
	}
	return ids, nil
}

// nodeDir is kafka.sh's state folder of broker id.
func (e *Env) nodeDir(id int) (string, error) {
	m, err := e.cluster()
	if err != nil {
		return "", err
	}
	if m == nil {
		if id != 1 {
			return "", fmt.Errorf("testenv: a single broker has no broker %d", id)
		}
		return e.Dir, nil
	}
	return ClusterDir(e.Dir).node(id), nil
}

// BrokerAddr is broker id's PLAINTEXT address ("127.0.0.1:port").
func (e *Env) BrokerAddr(id int) (string, error) {
	d, err := e.nodeDir(id)
	if err != nil {
		return "", err
	}
	return nodeAddr(d, "KAFKA_PORT")
}

// ClusterDir is a cluster's state folder (Options.Dir): the addresses its
// nodes bind, readable as soon as each is known, while the cluster starts.
type ClusterDir string

// node is kafka.sh's state folder of node id (0: the controller).
func (d ClusterDir) node(id int) string {
	return filepath.Join(string(d), fmt.Sprintf("kafka-node%d", id))
}

// Listener is where broker id binds its extra listener name, known once
// kafka.sh has picked the port (before the broker starts).
func (d ClusterDir) Listener(id int, name string) (string, error) {
	return nodeAddr(d.node(id), "KAFKA_"+name+"_PORT")
}

// Controller is where the controller binds its listener, known before any
// node starts.
func (d ClusterDir) Controller() (string, error) {
	m, err := readEnvFile(filepath.Join(string(d), "kafka-cluster.env"))
	if err != nil {
		return "", err
	}
	if m["CONTROLLER_PORT"] == "" {
		return "", fmt.Errorf("testenv: no cluster in %s (yet)", d)
	}
	return "127.0.0.1:" + m["CONTROLLER_PORT"], nil
}

// nodeAddr is 127.0.0.1 and the port key of kafka.sh's kafka.env in dir.
func nodeAddr(dir, key string) (string, error) {
	m, err := readEnvFile(filepath.Join(dir, "kafka.env"))
	if err != nil {
		return "", err
	}
	if m[key] == "" {
		return "", fmt.Errorf("testenv: no %s in %s (yet)", key, dir)
	}
	return "127.0.0.1:" + m[key], nil
}

// StopBroker stops broker id with SIGTERM: a controlled shutdown, which
// moves its leaderships away first. It keeps its data.
func (e *Env) StopBroker(id int) error { return e.node("stop", id) }

// KillBroker kills broker id with SIGKILL, keeping its data.
func (e *Env) KillBroker(id int) error { return e.node("kill", id) }

// StartBroker starts broker id again on its ports and data and waits until
// it is ready.
func (e *Env) StartBroker(id int) error { return e.node("start", id) }

func (e *Env) node(cmd string, id int) error {
	m, err := e.cluster()
	if err != nil {
		return err
	}
	if m == nil {
		if id != 1 {
			return fmt.Errorf("testenv: a single broker has no broker %d", id)
		}
		return e.control("kafka.sh", cmd, e.Dir)
	}
	return e.control("kafka-cluster.sh", cmd, e.Dir, strconv.Itoa(id))
}

// Leaders reads topic's partitions: each one's leader broker id and
// in-sync replicas, from any broker that answers.
func (e *Env) Leaders(ctx context.Context, topic string) (map[int]PartitionState, error) {
	var last error
	for _, b := range splitBrokers(e.KafkaBrokers) {
		ps, err := readPartitions(ctx, b, topic)
		if err != nil {
			last = err
			continue
		}
		out := map[int]PartitionState{}
		for _, p := range ps {
			st := PartitionState{Leader: p.Leader.ID}
			for _, r := range p.Isr {
				st.ISR = append(st.ISR, r.ID)
			}
			sort.Ints(st.ISR)
			out[p.ID] = st
		}
		return out, nil
	}
	return nil, fmt.Errorf("testenv: no broker answered for %s: %w", topic, last)
}

// PartitionState is one partition's leader and in-sync replicas.
type PartitionState struct {
	Leader int
	ISR    []int
}

// WaitISR waits until every partition of topic has a leader and rf
// replicas in sync (a restarted broker has caught up).
func (e *Env) WaitISR(ctx context.Context, topic string, timeout time.Duration) error {
	rf := e.replicationFactor()
	deadline := time.Now().Add(timeout)
	for {
		ls, err := e.Leaders(ctx, topic)
		full := err == nil && len(ls) > 0
		for _, st := range ls {
			full = full && st.Leader >= 0 && len(st.ISR) >= rf
		}
		if full {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: %s not fully in sync after %s: %v (%v)", topic, timeout, ls, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
