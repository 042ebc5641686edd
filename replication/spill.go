package replication

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/outboxd/outboxd/envelope"
)

// spillMemory is how many bytes of a streamed transaction's changes are
// kept in memory before they go to its spill file: a transaction of a few
// rows never touches the disk, one of a million rows costs this much
// memory and a file.
const spillMemory = 256 << 10

// spillBuffer is the buffered writer's and reader's size over a spill file.
const spillBuffer = 64 << 10

// The kinds of a spilled change.
const (
	changeInsert  = 'I' // an Insert, its message as protocol 1 sends it
	changeMessage = 'M' // a routed transactional logical message, likewise
	// changeNone is a change that makes no record (a transactional logical
	// message without a route): it only counts in the transaction's index.
	changeNone = 'n'
)

// spillHeader is a spilled change's header: kind byte, xid uint32, binding
// uint32, length uint32; the message follows.
const spillHeader = 13

// spill holds the changes of one streamed transaction from its first
// Stream Start to its Stream Commit or Stream Abort, in arrival order:
// up to spillMemory bytes in memory, then all of them in a file of its own
// under dir (spillPattern). Nothing of it is published before the commit.
type spill struct {
	dir, slot string
	xid       uint32

	mem  []byte            // the changes, while they fit
	f    *os.File          // from the first change that did not
	w    *bufio.Writer     // over f
	size int64             // bytes written, in memory or to f
	n    int               // changes
	hdr  [spillHeader]byte // the header being written (a local would escape)

	// bindings are the routes of the changes: each change names its
	// entry, the routes that applied when it arrived.
	bindings []([]*envelope.Binding)
	bindIdx  map[*envelope.Binding]uint32 // by the first binding of each entry
	// relations are the transaction's own Relation messages: they apply
	// to its changes, and to everything after its commit.
	relations map[uint32][]*envelope.Binding
	// aborted are the subtransactions rolled back (Stream Abort): their
	// changes are skipped at the commit.
	aborted map[uint32]bool
	// unrouted: a change made no record (changeNone), and may have been
	// a rolled-back savepoint's (streamedChange).
	unrouted bool
}

// spillPattern is the name of a spill file of slot, as os.CreateTemp takes
// it: a slot name has no '-', so the files of one slot never match
// another's (cleanSpills).
func spillPattern(slot string, xid uint32) string {
	return fmt.Sprintf("outboxd-%s-%d-*.spill", slot, xid)
}

// WritableDir is nil when dir is a directory outboxd can create files in
// (a spill file, at the first streamed transaction past the memory
// buffer): DecideStreaming asks it.
func WritableDir(dir string) error {
	f, err := os.CreateTemp(dir, ".outboxd-probe-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// cleanSpills removes the spill files a session of slot left in dir: a
// killed process's, which nothing reads (the server sends their
// transactions again from their start). Called once the slot is ours: a
// standby instance on the same machine must not remove the active one's.
func cleanSpills(dir, slot string) (int, error) {
	names, err := filepath.Glob(filepath.Join(dir, "outboxd-"+slot+"-*.spill"))
	if err != nil {
		return 0, err
	}
	for _, n := range names {
		if err := os.Remove(n); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("remove a stale spill file: %w", err)
		}
	}
	return len(names), nil
}

func newSpill(dir, slot string, xid uint32) *spill {
	return &spill{dir: dir, slot: slot, xid: xid, bindIdx: map[*envelope.Binding]uint32{},
		relations: map[uint32][]*envelope.Binding{}, aborted: map[uint32]bool{}}
}

// add appends one change of subtransaction xid (the top-level xid for the
// transaction's own): kind, its routes bs, and msg, the message as
// protocol 1 has it (type byte, then what follows the xid), given as its
// type byte and body so that nothing is copied. It returns the bytes that
// went to the file (0 while in memory).
func (sp *spill) add(kind byte, xid uint32, bs []*envelope.Binding, typ byte, body []byte) (int64, error) {
	var b uint32
	if len(bs) > 0 {
		i, ok := sp.bindIdx[bs[0]]
		if !ok {
			i = uint32(len(sp.bindings))
			sp.bindings = append(sp.bindings, bs)
			sp.bindIdx[bs[0]] = i
		}
		b = i
	}
	n := 0
	if kind != changeNone {
		n = 1 + len(body)
	} else {
		sp.unrouted = true
	}
	h := &sp.hdr
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], xid)
	binary.BigEndian.PutUint32(h[5:], b)
	binary.BigEndian.PutUint32(h[9:], uint32(n))
	size := int64(spillHeader + n)
	sp.size += size
	sp.n++
	if sp.f == nil && len(sp.mem)+int(size) <= spillMemory {
		sp.mem = append(sp.mem, h[:]...)
		if n > 0 {
			sp.mem = append(append(sp.mem, typ), body...)
		}
		return 0, nil
	}
	written := int64(0)
	if sp.f == nil {
		f, err := os.CreateTemp(sp.dir, spillPattern(sp.slot, sp.xid))
		if err != nil {
			return 0, fmt.Errorf("spill a streamed transaction (pipeline.spill_dir): %w", err)
		}
		sp.f, sp.w = f, bufio.NewWriterSize(f, spillBuffer)
		if _, err := sp.w.Write(sp.mem); err != nil {
			return 0, fmt.Errorf("write spill file: %w", err)
		}
		written, sp.mem = int64(len(sp.mem)), nil
	}
	_, _ = sp.w.Write(h[:]) // a bufio.Writer's error comes back at every later call
	if n > 0 {
		_ = sp.w.WriteByte(typ)
		if _, err := sp.w.Write(body); err != nil {
			return 0, fmt.Errorf("write spill file: %w", err)
		}
	}
	return written + size, nil
}

// close removes the spill file, if any: at the commit once replayed, at
// the abort, at the session's end.
func (sp *spill) close() {
	if sp.f != nil {
		_ = sp.f.Close()
		_ = os.Remove(sp.f.Name())
		sp.f, sp.w = nil, nil
	}
	sp.mem = nil
}

// replay reads the changes back in arrival order, skipping those of
// aborted subtransactions.
func (sp *spill) replay() (*spillReader, error) {
	r := &spillReader{sp: sp}
	if sp.f == nil {
		r.r = bufio.NewReaderSize(bytes.NewReader(sp.mem), 4096)
		return r, nil
	}
	if err := sp.w.Flush(); err != nil {
		return nil, fmt.Errorf("write spill file: %w", err)
	}
	if _, err := sp.f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read spill file: %w", err)
	}
	r.r = bufio.NewReaderSize(sp.f, spillBuffer)
	return r, nil
}

// spillReader is a spill read back.
type spillReader struct {
	sp   *spill
	read int // changes read, skipped ones included
	r    *bufio.Reader
	hdr  [spillHeader]byte // the current change's header (a local would escape)
	buf  []byte            // the current change's message, reused
}

// spilledChange is one change read back: msg is valid until the next read.
type spilledChange struct {
	kind byte
	bs   []*envelope.Binding
	msg  []byte
}

// next returns the next change that survives, or io.EOF after the last.
func (r *spillReader) next() (spilledChange, error) {
	h := &r.hdr
	for {
		if _, err := io.ReadFull(r.r, h[:]); err != nil {
			if errors.Is(err, io.EOF) && r.read == r.sp.n {
				return spilledChange{}, io.EOF
			}
			if errors.Is(err, io.EOF) {
				// Cut short: what is left would be a part of the
				// transaction.
				return spilledChange{}, fmt.Errorf("read spill file: %d changes of %d", r.read, r.sp.n)
			}
			return spilledChange{}, fmt.Errorf("read spill file: %w", err)
		}
		r.read++
		n := int(binary.BigEndian.Uint32(h[9:]))
		if cap(r.buf) < n {
			r.buf = make([]byte, n)
		}
		r.buf = r.buf[:n]
		if _, err := io.ReadFull(r.r, r.buf); err != nil {
			return spilledChange{}, fmt.Errorf("read spill file: %w", err)
		}
		if r.sp.aborted[binary.BigEndian.Uint32(h[1:])] {
			continue
		}
		c := spilledChange{kind: h[0], msg: r.buf}
		if c.kind != changeNone {
			b := binary.BigEndian.Uint32(h[5:])
			if int(b) >= len(r.sp.bindings) {
				return spilledChange{}, fmt.Errorf("spill file: change names routes %d of %d", b, len(r.sp.bindings))
			}
			c.bs = r.sp.bindings[b]
		}
		return c, nil
	}
}
