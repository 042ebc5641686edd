package sink

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd"
)

// tailReadsAtOnce bounds the tail reads a session makes side by side.
const tailReadsAtOnce = 8

// tailReader reads the position of the last record of the stream in a
// partition (readKafkaTail; tests replace it).
type tailReader func(ctx context.Context, topic string, partition int32, partitions int) (pos outboxd.Pos, found bool, err error)

// tailReads runs the reads of partitions' tails (restart de-duplication,
// dedupe.go) off the sender's path: each read on a goroutine of its own, at
// most tailReadsAtOnce at a time, its answer handed back to the sender
// (answers), which alone changes a partition's state. Meanwhile the sender
// settles acknowledgements and sends the other partitions' records, and a
// partition's held records go as soon as its own tail is known, not once
// every tail of the pass is. A read answered without error is progress
// (Producer.Progress): a start that reads hundreds of tails on a distant
// cluster is not taken for a silent broker.
type tailReads struct {
	ctx     context.Context // ends the reads when the sender stops
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	running int // reads started and not taken back yet; the sender's
	// answers has room for every read running: a read never waits to
	// hand its answer over, even once the sender has stopped.
	answers  chan tailAnswer
	answered atomic.Uint64 // reads answered without error
}

// tailAnswer is one read's answer for a partition.
type tailAnswer struct {
	pt    *partition
	pos   outboxd.Pos
	found bool
	err   error
}

func newTailReads() *tailReads {
	ctx, cancel := context.WithCancel(context.Background())
	return &tailReads{ctx: ctx, cancel: cancel, answers: make(chan tailAnswer, tailReadsAtOnce)}
}

// free says whether another read may start. The sender's.
func (r *tailReads) free() bool { return r.running < tailReadsAtOnce }

// start reads pt's tail with read, the partition counted among parts,
// within budget. The sender's, when free.
func (r *tailReads) start(read tailReader, pt *partition, parts int, budget time.Duration) {
	r.running++
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(r.ctx, budget)
		defer cancel()
		a := tailAnswer{pt: pt}
		a.pos, a.found, a.err = read(ctx, pt.topic, pt.id, parts)
		if a.err == nil {
			r.answered.Add(1)
		}
		r.answers <- a
	}()
}

// took counts an answer the sender received off the reads running.
func (r *tailReads) took() { r.running-- }

// stop ends the reads still running and waits for them.
func (r *tailReads) stop() {
	r.cancel()
	r.wg.Wait()
}

// Progress counts what the producer learnt from Kafka besides the
// outcomes of records: the tails it read. The publisher's delivery timeout
// takes it as a sign of life (publish.Publisher.Check).
func (p *Producer) Progress() uint64 { return p.reads.answered.Load() }
