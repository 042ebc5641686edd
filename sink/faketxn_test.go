package sink

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
)

// fakeCoordinator is the transaction coordinator of one transactional id,
// with what a read_committed consumer of the fake broker's partition 0
// sees. As a Kafka 4.1 coordinator (transaction version 1) it gives one
// producer id and a higher epoch at each InitProducerId, which aborts the
// transaction left open; refuses an older epoch (PRODUCER_FENCED);
// requires a partition to be added before a transactional batch is
// appended to it (INVALID_TXN_STATE otherwise, as a leader with
// transaction.partition.verification.enable) and the produce request to
// name the transactional id; and makes the open
// transaction's records visible at EndTxn. It exists for the faults a
// real coordinator cannot be made to answer on demand (a commit refused
// or held at a chosen moment); the integration tests use a real one.
type fakeCoordinator struct {
	// endFail, when set, answers the n-th EndTxn (from 0) with that code;
	// endGate, when set, holds every EndTxn until it is closed.
	endFail func(n int) int16
	endGate chan struct{}
	// endsArrived counts EndTxn requests, held or not.
	endsArrived atomic.Int32

	mu        sync.Mutex
	epoch     int16
	inits     []int16 // the epoch each InitProducerId named (-1: none)
	added     map[int32]bool
	open      []string // appended in the open transaction
	committed []string // committed, in order: what read_committed sees
	aborted   []string
	ends      int
	commits   int
}

const fakeTxnPID = 2000

func (c *fakeCoordinator) roundTrip(ctx context.Context, req protocol.Message) (protocol.Message, error) {
	if _, ok := req.(*endtxn.Request); ok && c.endGate != nil {
		c.endsArrived.Add(1)
		if err := hold(ctx, c.endGate); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r := req.(type) {
	case *initproducerid.Request:
		c.inits = append(c.inits, r.ProducerEpoch)
		if r.ProducerEpoch >= 0 && r.ProducerEpoch != c.epoch {
			return &initproducerid.Response{ErrorCode: int16(kafka.ProducerFenced), ProducerID: -1, ProducerEpoch: -1}, nil
		}
		c.aborted = append(c.aborted, c.open...)
		c.open, c.added = nil, nil
		c.epoch++
		return &initproducerid.Response{ProducerID: fakeTxnPID, ProducerEpoch: c.epoch}, nil
	case *addpartitionstotxn.Request:
		res := &addpartitionstotxn.Response{}
		for _, t := range r.Topics {
			out := addpartitionstotxn.ResponseResult{Name: t.Name}
			for _, p := range t.Partitions {
				code := int16(0)
				if r.ProducerEpoch != c.epoch {
					code = int16(kafka.ProducerFenced)
				} else {
					if c.added == nil {
						c.added = map[int32]bool{}
					}
					c.added[p] = true
				}
				out.Results = append(out.Results, addpartitionstotxn.ResponsePartition{PartitionIndex: p, ErrorCode: code})
			}
			res.Results = append(res.Results, out)
		}
		return res, nil
	case *endtxn.Request:
		n := c.ends
		c.ends++
		if c.endFail != nil {
			if code := c.endFail(n); code != 0 {
				return &endtxn.Response{ErrorCode: code}, nil
			}
		}
		if r.ProducerEpoch != c.epoch {
			return &endtxn.Response{ErrorCode: int16(kafka.ProducerFenced)}, nil
		}
		c.committed = append(c.committed, c.open...)
		c.open, c.added = nil, nil
		c.commits++
		return &endtxn.Response{}, nil
	}
	return nil, nil
}

// produced is the coordinator's word on a transactional batch the leader
// is about to append (dup: it holds it already): 0, or the error code.
// Called with the broker's mu held.
func (c *fakeCoordinator) produced(id string, part int32, pid int64, epoch int16, transactional bool, msgs []kafka.Message, dup bool) int16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !transactional:
		// A leader refuses the transactional producer's batch that is
		// not marked transactional while its transaction is open there.
		if c.added[part] {
			return int16(kafka.InvalidTransactionState)
		}
		return 0
	case id == "":
		// A Kafka 4.1 broker's answer to transactional records in a
		// request that names no transactional id.
		return int16(kafka.TransactionalIDAuthorizationFailed)
	case pid != fakeTxnPID || epoch < c.epoch:
		return int16(kafka.ProducerFenced)
	case !c.added[part]:
		return int16(kafka.InvalidTransactionState)
	}
	if !dup {
		for _, m := range msgs {
			c.open = append(c.open, string(m.Value))
		}
	}
	return 0
}

// seen is what a read_committed consumer reads, and what was aborted.
func (c *fakeCoordinator) seen() (committed, aborted []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.committed), slices.Clone(c.aborted)
}
