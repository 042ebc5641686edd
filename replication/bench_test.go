package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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
			router, first := benchOutbox(b)
			benchStream(b, router, comp, first['R'], first['B'], first['I'], first['C'], 1)
		})
	}
}

// benchOutbox is the router of the recorded fixture's outbox to one topic,
// and the first recorded message of each type.
func benchOutbox(b *testing.B) (*envelope.Router, map[byte][]byte) {
	first := map[byte][]byte{}
	for _, m := range readFixture(b, "testdata/outbox.pgoutput") {
		if first[m[0]] == nil {
			first[m[0]] = m
		}
	}
	router, err := envelope.NewRouter("comandes", []envelope.Route{{Schema: "public", Table: "outbox", Topic: "comandes.esdeveniments",
		Columns: envelope.Columns{ID: "id", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "carrega", CreatEn: "creat_en"}}}, 0)
	if err != nil {
		b.Fatal(err)
	}
	return router, first
}

// benchStream streams change b.N times through router, the stream and the
// producer (compression comp, a broker that acknowledges at once), in
// transactions of 100 opened by begin and closed by commit, after the
// setup message; records is how many records one change makes.
func benchStream(b *testing.B, router *envelope.Router, comp string, setup, begin, change, commit []byte, records int) {
	s, feed := benchStreamOver(b, router, comp)
	feed(setup)
	b.SetBytes(int64(len(change)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%100 == 0 {
			if i > 0 {
				feed(commit)
			}
			for s.pub.Full(0) {
				<-s.pub.Wake()
			}
			feed(begin)
		}
		feed(change)
	}
	feed(commit)
	for s.tracker.State().Open > 0 {
		<-s.pub.Wake()
	}
	if records > 1 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*records), "ns/record")
	}
}

// benchStreamOver is a stream over router and a producer (compression
// comp) to a broker that acknowledges at once, and what feeds it one
// message, from a buffer reused as the connection's is.
func benchStreamOver(b *testing.B, router *envelope.Router, comp string) (*stream, func(m []byte)) {
	prod, err := sink.NewWithTransport(sink.Config{Brokers: []string{"null:9092"}, Partitioner: "murmur2", Compression: comp, Linger: 5 * time.Millisecond,
		BatchSize: 1000, BatchBytes: 1 << 20, MaxAttempts: 1, WriteTimeout: time.Second, OnPartitionChange: sink.PartitionsFollow}, hclog.NewNullLogger(), nullBroker{partitions: 6})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prod.Close(context.Background()) })
	s := newTestStream(router, prod, 1, Config{MaxInFlightEvents: 10000, MaxInFlightBytes: 64 << 20})
	buf := make([]byte, 0, 4096)
	return s, func(m []byte) {
		buf = append(buf[:0], m...)
		if err := s.handleMessage(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStreamedTransaction: BenchmarkStream/lz4's row in one streamed
// transaction of b.N rows (protocol 2): one op is one row received in a
// stream and spilled (to a file past 256 KiB), read back at the Stream
// Commit, built, encoded and acknowledged. Against BenchmarkStream/lz4 at
// the same count, the cost of holding a transaction until its commit:
// go test -run X -bench 'Stream$|StreamedTransaction' -benchtime 200000x -benchmem -cpu 1 ./replication
func BenchmarkStreamedTransaction(b *testing.B) {
	router, first := benchOutbox(b)
	rel, ins := first['R'], first['I']
	s, feed := benchStreamOver(b, router, "lz4")
	s.streamed = newStreamedTxns(b.TempDir(), "bench")
	defer s.streamed.close()
	const xid = 1000
	change := inStream(xid, ins)
	feed(rel)
	b.SetBytes(int64(len(ins)))
	b.ReportAllocs()
	b.ResetTimer()
	feed(streamStartMsg(xid, true))
	for i := 0; i < b.N; i++ {
		feed(change)
	}
	feed(streamStopMsg())
	feed(streamCommitMsg(xid, 0x9000, 0x9010))
	for s.streamed.replay != nil {
		for s.pub.Full(0) {
			<-s.pub.Wake()
		}
		if err := s.replayStep(); err != nil {
			b.Fatal(err)
		}
	}
	for s.tracker.State().Open > 0 {
		<-s.pub.Wake()
	}
}

// richRelation and richInsert are a Relation and an Insert message of an
// outbox with a market and a trace context, as pgoutput (protocol 1) sends
// them: the recorded fixture has neither column.
func richMessages() (rel, ins []byte) {
	cols := []struct {
		name string
		oid  uint32
		val  string
	}{
		{"id", 2950, "6f1c9e2a-0a4b-4c8e-9d1f-2b3c4d5e6f70"}, {"agregat", 25, "comanda"}, {"agregat_id", 25, "P-2026-000123"},
		{"tipus", 25, "comanda.creada"}, {"versio", 23, "1"},
		{"carrega", 3802, `{"id": "P-2026-000123", "client": "anna", "linies": [{"producte": "formatge-curat", "quantitat": 2, "preu_centims": 1450}]}`},
		{"creat_en", 1184, "2026-09-10 09:33:20.123999+02"}, {"mercat", 25, "girona"},
		{"traceparent", 25, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, {"tracestate", 25, "congo=t61rcWkgMzE"},
	}
	rel = append([]byte{'R', 0, 0, 0x40, 0x01}, "public\x00outbox\x00d"...)
	rel = binary.BigEndian.AppendUint16(rel, uint16(len(cols)))
	ins = append([]byte{'I', 0, 0, 0x40, 0x01, 'N'}, 0, 0)
	binary.BigEndian.PutUint16(ins[6:], uint16(len(cols)))
	for _, c := range cols {
		rel = append(append(append(rel, 0), c.name...), 0)
		rel = binary.BigEndian.AppendUint32(rel, c.oid)
		rel = binary.BigEndian.AppendUint32(rel, 0xffffffff)
		ins = append(ins, 't')
		ins = binary.BigEndian.AppendUint32(ins, uint32(len(c.val)))
		ins = append(ins, c.val...)
	}
	return rel, ins
}

// BenchmarkStreamRouted: BenchmarkStream with the richest routing: one op
// is one row published twice (a templated route with an override, fields
// in a header and the envelope, the trace context, position headers and
// the record timestamp; and a filtered raw-payload route), or one
// transactional logical message. Run with -cpu 1: ns/op is CPU per row.
func BenchmarkStreamRouted(b *testing.B) {
	var begin, commit, msg []byte
	for _, m := range readFixture(b, "testdata/outbox.pgoutput") {
		switch {
		case m[0] == 'B' && begin == nil:
			begin = m
		case m[0] == 'C' && commit == nil:
			commit = m
		case m[0] == 'M' && m[1] == 1 && bytes.Contains(m, []byte("comandes")):
			msg = m
		}
	}
	rel, ins := richMessages()
	main := envelope.Route{Schema: "public", Table: "outbox", Topic: "{agregat}.esdeveniments", TopicFallback: "altres", Columns: seedColumns,
		Overrides: []envelope.Override{{When: []envelope.Condition{{Column: "tipus", Values: []string{"comanda.prova"}}}, Drop: true}},
		Fields:    []envelope.Field{{Column: "mercat", Header: "mercat"}, {Column: "mercat", Envelope: "mercat"}},
		Trace:     envelope.Trace{Traceparent: "traceparent", Tracestate: "tracestate"}, Position: true, Timestamp: "creat_en"}
	raw := envelope.Route{Schema: "public", Table: "outbox", Topic: "analitica", Columns: seedColumns, Value: envelope.ValuePayload,
		Filter: []envelope.Condition{{Column: "tipus", Values: []string{"comanda.creada"}}}, Position: true}
	messages := envelope.Route{Prefix: "comandes", Topic: "{tipus}", Position: true,
		Columns: envelope.Columns{ID: "id_esdeveniment", AgregatID: "agregat_id", Tipus: "tipus", Versio: "versio", Carrega: "dades"}}
	for _, w := range []struct {
		name    string
		records int
		change  []byte
	}{{"row-to-2-routes", 2, ins}, {"message", 1, msg}} {
		b.Run(w.name, func(b *testing.B) {
			router, err := envelope.NewRouter("comandes", []envelope.Route{main, raw, messages}, 0)
			if err != nil {
				b.Fatal(err)
			}
			benchStream(b, router, "lz4", rel, begin, w.change, commit, w.records)
		})
	}
}
