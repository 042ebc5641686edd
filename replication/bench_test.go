package replication

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outboxd/outboxd/envelope"
	"github.com/outboxd/outboxd/sink"
)

// nullBroker acknowledges every produce request at once (after reading its
// record sets, as a connection would). For the benchmark only: what it
// measures is outboxd's own work per event.
type nullBroker struct{ partitions int }

func (b nullBroker) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	switch r := req.(type) {
	case *metadata.Request:
		ps := make([]metadata.ResponsePartition, b.partitions)
		for i := range ps {
			ps[i] = metadata.ResponsePartition{PartitionIndex: int32(i), LeaderID: 1}
		}
		return &metadata.Response{Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0], Partitions: ps}}}, nil
	case *rawproduce.Request:
		res := &produce.Response{}
		for _, t := range r.Topics {
			rt := produce.ResponseTopic{Topic: t.Topic}
			for _, p := range t.Partitions {
				_, _ = io.Copy(io.Discard, p.RecordSet.Reader)
				rt.Partitions = append(rt.Partitions, produce.ResponsePartition{Partition: p.Partition})
			}
			res.Topics = append(res.Topics, rt)
		}
		return res, nil
	}
	return nil, io.ErrUnexpectedEOF
}

// BenchmarkStream: one op is one outbox row, decoded from recorded pgoutput
// bytes (transactions of 100), built into its envelope, encoded into a
// record batch (lz4) and acknowledged. Run with -cpu 1 so that ns/op is
// CPU per event: go test -run X -bench Stream -benchmem -cpu 1 ./replication
func BenchmarkStream(b *testing.B) {
	for _, comp := range []string{"lz4", "none"} {
		b.Run(comp, func(b *testing.B) {
			var begin, rel, ins, commit []byte
			for _, m := range readFixture(b, "testdata/outbox.pgoutput") {
				switch {
				case m[0] == 'B' && begin == nil:
					begin = m
				case m[0] == 'R' && rel == nil:
					rel = m
				case m[0] == 'I' && ins == nil:
					ins = m
				case m[0] == 'C' && commit == nil:
					commit = m
				}
			}
			router, err := envelope.NewRouter("comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.esdeveniments",
				Columns: envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}}}, 0)
			if err != nil {
				b.Fatal(err)
			}
			prod, err := sink.NewWithTransport(sink.Config{Brokers: []string{"null:9092"}, Partitioner: "murmur2", Compression: comp, Linger: 5 * time.Millisecond,
				BatchSize: 1000, BatchBytes: 1 << 20, MaxAttempts: 1, WriteTimeout: time.Second}, hclog.NewNullLogger(), nullBroker{partitions: 6})
			if err != nil {
				b.Fatal(err)
			}
			defer prod.Close(context.Background())
			tracker := NewTracker(pglogrepl.LSN(1), 10000, 64<<20)
			s := &stream{r: &Runner{router: router, log: hclog.NewNullLogger()}, prod: prod, tracker: tracker, relations: map[uint32][]*envelope.Binding{}}
			buf := make([]byte, 0, 4096)
			feed := func(m []byte) {
				buf = append(buf[:0], m...)
				if err := s.handleMessage(buf); err != nil {
					b.Fatal(err)
				}
			}
			feed(rel)
			b.SetBytes(int64(len(ins)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%100 == 0 {
					if i > 0 {
						feed(commit)
					}
					for tracker.Full(0) {
						<-tracker.Wake()
					}
					feed(begin)
				}
				feed(ins)
			}
			feed(commit)
			for tracker.State().Open > 0 {
				<-tracker.Wake()
			}
		})
	}
}
