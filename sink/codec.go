package sink

import (
	"fmt"
	"io"
	"sync"

	"github.com/pierrec/lz4/v4"
	"github.com/segmentio/kafka-go/compress"
)

// compressions are the Config.Compression values and their codecs, nil
// for none.
var compressions = []option[func() compress.Codec]{
	{"none", func() compress.Codec { return nil }},
	{"gzip", compress.Gzip.Codec},
	{"snappy", compress.Snappy.Codec},
	{"lz4", func() compress.Codec { return lz4Codec{} }},
	{"zstd", compress.Zstd.Codec},
}

// Compressions lists the Config.Compression values (kafka.compression).
func Compressions() []string { return names(compressions) }

// codec returns the codec for a kafka.compression name, nil for none.
func codec(name string) (compress.Codec, error) {
	if c, ok := lookup(compressions, name); ok {
		return c(), nil
	}
	return nil, fmt.Errorf("unknown compression %q", name)
}

// lz4Codec is kafka-go's lz4 codec with 64 KiB frame blocks instead of the
// pierrec/lz4 default of 4 MiB, which is the Java client's block size too.
// Every pooled writer holds its block buffers, so with 4 MiB blocks lz4
// alone kept ~12 MB of heap per process in the drain profile; record
// batches are far smaller than a block anyway.
type lz4Codec struct{}

var (
	lz4Writers sync.Pool
	kafkaLz4   = compress.Codecs[compress.Lz4] // kafka-go's own, for reading
)

func (lz4Codec) Code() int8   { return kafkaLz4.Code() }
func (lz4Codec) Name() string { return "lz4" }

func (lz4Codec) NewReader(r io.Reader) io.ReadCloser {
	// outboxd only produces; reading is delegated unchanged.
	return kafkaLz4.NewReader(r)
}

func (lz4Codec) NewWriter(w io.Writer) io.WriteCloser {
	z, _ := lz4Writers.Get().(*lz4.Writer)
	if z == nil {
		z = lz4.NewWriter(w)
		_ = z.Apply(lz4.BlockSizeOption(lz4.Block64Kb))
	} else {
		z.Reset(w)
	}
	return &lz4Writer{z}
}

type lz4Writer struct{ *lz4.Writer }

func (w *lz4Writer) Close() error {
	z := w.Writer
	if z == nil {
		return nil
	}
	w.Writer = nil
	err := z.Close()
	z.Reset(nil)
	lz4Writers.Put(z)
	return err
}
