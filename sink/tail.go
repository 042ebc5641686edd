package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/fetch"
	"github.com/segmentio/kafka-go/protocol/listoffsets"

	"github.com/outboxd/outboxd"
	"github.com/outboxd/outboxd/clock"
)

// tailWindows are how many records before the high watermark readTail
// looks at for the stream's last record, in turn: the partition's tail is
// read, never the partition.
var tailWindows = []int64{512, 16384}

// tailFetchBytes bounds one fetch of the tail.
const tailFetchBytes = 1 << 20

// readKafkaTail is the tailReader: the position of the last record of the
// stream (Config.Stream, under partitions partitions) below the
// partition's last stable offset, from its leader, before deadline (and
// within WriteTimeout), read as a read_committed consumer reads it. Only
// what every in-sync replica holds counts (the last stable offset is at or
// below the high watermark: a record above that may still be truncated),
// and only what was committed (a record of a transaction left open or
// aborted, by an instance the transaction coordinator fenced, proves
// nothing).
//
// The tail is read from the larger of the window's start and the
// partition's log start offset: Kafka's retention (retention.ms,
// retention.bytes, DeleteRecords) deletes a partition's oldest records,
// and a fetch below the log start is refused. A partition whose log start
// has reached its end (every record deleted: a quiet partition a week
// after its last record) holds nothing of the stream: it proves nothing,
// and that is known at once. Retention that moves the log start while the
// tail is read makes the fetch refuse the offset: the log start is read
// again and the window starts over from it, a few times at most.
func (p *Producer) readKafkaTail(ctx context.Context, topic string, partition int32, partitions int) (outboxd.Pos, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	end, err := p.listOffset(ctx, topic, partition, offsetLatest)
	if err != nil || end == 0 {
		return outboxd.Pos{}, false, err
	}
	for moved := 0; ; moved++ {
		start, err := p.listOffset(ctx, topic, partition, offsetEarliest)
		if err != nil || start >= end {
			return outboxd.Pos{}, false, err // an error, or nothing left to read
		}
		pos, found, err := p.scanWindows(ctx, topic, partition, start, end, partitions)
		if errors.Is(err, kafka.OffsetOutOfRange) && moved < tailStartMoves {
			continue // retention deleted records meanwhile: from the new log start
		}
		return pos, found, err
	}
}

// tailStartMoves is how often readKafkaTail starts over when retention
// deletes the records it was about to read.
const tailStartMoves = 3

// scanWindows looks for the stream's last record in [start, end) through
// tailWindows, the window widened while nothing of the stream is found
// and records before it remain.
func (p *Producer) scanWindows(ctx context.Context, topic string, partition int32, start, end int64, partitions int) (outboxd.Pos, bool, error) {
	for _, window := range tailWindows {
		from := max(start, end-window)
		pos, found, err := p.lastOfStream(ctx, topic, partition, from, end, partitions)
		if err != nil || found || from == start {
			return pos, found, err
		}
	}
	return outboxd.Pos{}, false, nil
}

// The ListOffsets timestamps that ask for a partition's end (its last
// stable offset, read_committed) and its log start offset.
const (
	offsetLatest   = -1
	offsetEarliest = -2
)

// listOffset is the partition's offset for timestamp (offsetLatest,
// offsetEarliest), as a read_committed consumer sees it.
func (p *Producer) listOffset(ctx context.Context, topic string, partition int32, timestamp int64) (int64, error) {
	res, err := p.rt.RoundTrip(ctx, p.bootstrap(), &listoffsets.Request{ReplicaID: -1, IsolationLevel: readCommitted,
		Topics: []listoffsets.RequestTopic{{Topic: topic, Partitions: []listoffsets.RequestPartition{{Partition: partition, CurrentLeaderEpoch: -1, Timestamp: timestamp}}}}})
	if err != nil {
		return 0, fmt.Errorf("list offsets: %w", err)
	}
	r, ok := res.(*listoffsets.Response)
	if !ok || len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 {
		return 0, fmt.Errorf("list offsets: unexpected answer %T", res)
	}
	pa := r.Topics[0].Partitions[0]
	if pa.ErrorCode != 0 {
		return 0, fmt.Errorf("list offsets: %w", kafka.Error(pa.ErrorCode))
	}
	return pa.Offset, nil
}

// lastOfStream reads [from, hw) and returns the position of the last record
// of the stream in it.
func (p *Producer) lastOfStream(ctx context.Context, topic string, partition int32, from, hw int64, partitions int) (last outboxd.Pos, found bool, err error) {
	var mv *macVerifier
	if p.mac != nil {
		mv = p.mac.verifier()
	}
	p.mu.Lock()
	pid := p.pid // a transactional producer's: the same across its sessions
	p.mu.Unlock()
	var forged rejections
	defer forged.log(p.log, topic, partition)
	for next := from; next < hw; {
		res, err := p.rt.RoundTrip(ctx, p.bootstrap(), &fetch.Request{ReplicaID: -1, MaxBytes: tailFetchBytes, IsolationLevel: readCommitted,
			Topics: []fetch.RequestTopic{{Topic: topic, Partitions: []fetch.RequestPartition{{Partition: partition, CurrentLeaderEpoch: -1, FetchOffset: next, LogStartOffset: -1, PartitionMaxBytes: tailFetchBytes}}}}})
		if err != nil {
			return last, false, fmt.Errorf("fetch: %w", err)
		}
		r, ok := res.(*fetch.Response)
		if !ok || len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 1 {
			return last, false, fmt.Errorf("fetch: unexpected answer %T", res)
		}
		pa := r.Topics[0].Partitions[0]
		if pa.ErrorCode != 0 {
			// OFFSET_OUT_OF_RANGE: below the log start (retention deleted
			// the records meanwhile; the answer's log start is -1 then,
			// so readKafkaTail asks again).
			return last, false, fmt.Errorf("fetch: %w", kafka.Error(pa.ErrorCode))
		}
		read, err := scanRecords(committedBatches(&pa), hw, &next, func(b *tailBatch, offset int64, h []protocol.Header) {
			for _, x := range h {
				if x.Key != HeaderStream || !p.ofStream(x.Value) {
					continue
				}
				v, why := mv.verify(topic, partition, x.Value)
				if why == "" && p.transactional() && (!b.transactional || b.producerID != pid) {
					why = "not in a transaction of this transactional id's producer id"
				}
				if why != "" {
					forged.add(topic, offset, why, p.cfg.Rejected)
					continue
				}
				if pos, ok := p.proof(v, partitions); ok {
					last, found = pos, true
				}
			}
		})
		if err != nil {
			return last, false, err
		}
		if read == 0 {
			break // nothing more below the high watermark (a compacted or transactional gap)
		}
	}
	return last, found, nil
}

// readCommitted is the isolation level of a read_committed consumer.
const readCommitted = 1

// tailBatch is a batch of a fetch answer and whether a read_committed
// consumer reads its records.
type tailBatch struct {
	records protocol.RecordReader
	visible bool
	// transactional and producerID: those of a record batch (v2).
	transactional bool
	producerID    int64
}

// committedBatches says which batches of a fetch answer a read_committed
// consumer reads: not the transactional batches of the transactions the
// answer calls aborted (from each one's first offset to its producer's
// next control batch, its abort marker), nor the control batches.
func committedBatches(pa *fetch.ResponsePartition) []tailBatch {
	stream, ok := pa.RecordSet.Records.(*protocol.RecordStream)
	if !ok {
		if pa.RecordSet.Records == nil {
			return nil
		}
		return []tailBatch{{records: pa.RecordSet.Records, visible: true, producerID: -1}}
	}
	aborted := slices.Clone(pa.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b fetch.ResponseTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	open := map[int64]bool{} // producers inside an aborted transaction
	out := make([]tailBatch, 0, len(stream.Records))
	for _, r := range stream.Records {
		base := int64(-1)
		switch b := r.(type) {
		case *protocol.RecordBatch:
			base = b.BaseOffset
		case *protocol.ControlBatch:
			base = b.BaseOffset
		}
		for len(aborted) > 0 && aborted[0].FirstOffset <= base {
			open[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		switch b := r.(type) {
		case *protocol.ControlBatch:
			delete(open, b.ProducerID)
			out = append(out, tailBatch{records: b})
		case *protocol.RecordBatch:
			txn := b.Attributes.Transactional()
			out = append(out, tailBatch{b, !txn || !open[b.ProducerID], txn, b.ProducerID})
		default:
			out = append(out, tailBatch{records: r, visible: true, producerID: -1}) // a v0 or v1 message set: never transactional
		}
	}
	return out
}

// scanRecords calls each with the batch, offset and headers of every
// record below hw of the visible batches, moves *next past every record
// below hw and returns how many it passed.
func scanRecords(batches []tailBatch, hw int64, next *int64, each func(*tailBatch, int64, []protocol.Header)) (int, error) {
	n := 0
	for i := range batches {
		b := &batches[i]
		for {
			rec, err := b.records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return n, fmt.Errorf("read the partition's tail: %w", err)
			}
			if rec.Offset < *next {
				continue // a batch starts before the offset asked for
			}
			if rec.Offset >= hw {
				return n, nil
			}
			if b.visible {
				each(b, rec.Offset, rec.Headers)
			}
			*next = rec.Offset + 1
			n++
		}
	}
	return n, nil
}

// ProbeTail reads the tail of the topic's partition 0 as a session does
// before its first record there (restart de-duplication), for outboxd
// check: nil, or why it cannot (TOPIC_AUTHORIZATION_FAILED: the principal
// may not READ the topic). The topic must exist.
func ProbeTail(ctx context.Context, cfg Config, topic string) error {
	t := newTransport(cfg)
	defer t.CloseIdleConnections()
	p := &Producer{cfg: cfg, rt: t, addr: kafka.TCP(cfg.Brokers...), clock: clock.Or(cfg.Clock)}
	ctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	hw, err := p.listOffset(ctx, topic, 0, offsetLatest)
	if err != nil {
		return err
	}
	start, err := p.listOffset(ctx, topic, 0, offsetEarliest)
	if err != nil {
		return err
	}
	// One record below the end, or the log's start when retention left
	// nothing: a fetch either way, which is what READ governs.
	from := max(start, hw-1)
	_, _, err = p.lastOfStream(ctx, topic, 0, from, max(hw, from+1), 0)
	return err
}
