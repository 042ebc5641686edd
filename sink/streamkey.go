package sink

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
)

// The stream header's MAC (issue 32). Any producer may write a record with
// an outboxd.stream header, and a copy of the last one in a partition with
// a larger position would make a restarted session skip records the
// partition never received. So the header ends with a MAC, HMAC-SHA256
// under a key only outboxd's instances hold (Config.StreamKey), over the
// record's topic, partition, whether the producer was transactional, and
// the rest of the header: a record proves a position only when the MAC
// verifies (lastOfStream). The topic and the partition are in it so that a
// header copied to another partition proves nothing there; a header copied
// within its partition proves what its original proves already, which is
// true, but for the records of an aborted transaction: they are in the
// log, readable, and not in the partition for a read_committed consumer.
// So a transactional producer's headers never verify for a producer that
// is not (the mode is in the MAC), and a transactional producer takes as
// proof only a record of a committed transaction of its own producer id
// (lastOfStream), which no copy is.

// streamMACLen is how many bytes of the HMAC-SHA256 the header keeps (in
// hex): 128 bits, beyond any forger's guessing.
const streamMACLen = 16

// minStreamKeyLen is the shortest key a key file may hold.
const minStreamKeyLen = 16

// ErrStreamKeyNotKept says a key file could not be made: the key lives in
// memory only, and records a process produced prove nothing to the next.
var ErrStreamKeyNotKept = errors.New("the stream key cannot be kept")

// LoadStreamKey reads the stream key from the file at path (its content,
// surrounding white space dropped, at least 16 bytes), or makes one there
// when there is none: 32 random bytes in hex, mode 0600, created whole
// (two instances starting at once agree on one). created: it was made now.
// An error wrapping ErrStreamKeyNotKept: there is no file and none can be
// made; any other error: the file is there but unusable.
func LoadStreamKey(path string) (key []byte, created bool, err error) {
	key, err = readStreamKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, false, fmt.Errorf("make a stream key: %w", err)
	}
	if err := createWhole(path, []byte(hex.EncodeToString(raw)+"\n")); err != nil {
		if errors.Is(err, fs.ErrExist) {
			key, err = readStreamKey(path) // another instance made it first
			return key, false, err
		}
		return nil, false, fmt.Errorf("make %s: %w: %w", path, ErrStreamKeyNotKept, err)
	}
	key, err = readStreamKey(path)
	return key, err == nil, err
}

// CheckStreamKey says, making nothing, what LoadStreamKey would do with
// path: exists, the file is there (err: why it is unusable); otherwise err
// nil, it would make one, or an error wrapping ErrStreamKeyNotKept, it
// could not.
func CheckStreamKey(path string) (exists bool, err error) {
	_, err = readStreamKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return true, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return false, fmt.Errorf("make %s: %w: %w", path, ErrStreamKeyNotKept, err)
	}
	tmp.Close()
	os.Remove(tmp.Name())
	return false, nil
}

func readStreamKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the stream key: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < minStreamKeyLen {
		return nil, fmt.Errorf("stream key %s: %d bytes, want at least %d (openssl rand -hex 32 makes one)", path, len(b), minStreamKeyLen)
	}
	return b, nil
}

// createWhole writes data to a new file at path, which appears with all of
// it or not at all: a temporary file linked to path (fs.ErrExist if there
// is one).
func createWhole(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Link(tmp.Name(), path)
}

// streamMAC tags the header values of one producer (withStream, under the
// producer's mu) and makes verifiers for its tail reads.
type streamMAC struct {
	key  []byte
	mode byte      // 't': a transactional producer's; 'i': an idempotent one's
	h    hash.Hash // keyed
	in   []byte    // scratch: what the MAC covers
	sum  []byte
}

func newStreamMAC(key []byte, transactional bool) *streamMAC {
	if len(key) == 0 {
		// No key file (Config.StreamKey): this producer's own, so nothing
		// an earlier process wrote verifies. Duplicates, never a loss.
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			panic(err) // crypto/rand never fails on a supported platform
		}
	}
	mode := byte('i')
	if transactional {
		mode = 't'
	}
	return &streamMAC{key: key, mode: mode, h: hmac.New(sha256.New, key)}
}

// appendMAC appends ";" and the MAC of v, a header value appendStream
// wrote, for a record of topic's partition.
func (m *streamMAC) appendMAC(v []byte, topic string, partition int32) []byte {
	m.in, m.sum = streamSum(m.h, m.in[:0], m.sum[:0], topic, partition, m.mode, v)
	return hex.AppendEncode(append(v, ';'), m.sum[:streamMACLen])
}

// streamSum is h's MAC of topic, partition, mode and v, computed over in
// (a scratch it returns) and appended to sum.
func streamSum(h hash.Hash, in, sum []byte, topic string, partition int32, mode byte, v []byte) ([]byte, []byte) {
	in = append(in, topic...)
	in = append(in, 0) // no topic name holds a NUL
	in = binary.BigEndian.AppendUint32(in, uint32(partition))
	in = append(in, mode)
	in = append(in, v...)
	h.Reset()
	h.Write(in)
	return in, h.Sum(sum)
}

// verifier checks the MACs of one tail read: a hash of its own, since
// tails are read side by side.
func (m *streamMAC) verifier() *macVerifier {
	return &macVerifier{mode: m.mode, h: hmac.New(sha256.New, m.key)}
}

type macVerifier struct {
	mode    byte
	h       hash.Hash
	in, sum []byte
}

// verify is v without its MAC when the MAC is the key's for topic's
// partition; otherwise why v proves nothing.
func (mv *macVerifier) verify(topic string, partition int32, v []byte) (payload []byte, why string) {
	i := bytes.LastIndexByte(v, ';')
	if i < 0 || len(v)-i-1 != hex.EncodedLen(streamMACLen) {
		return nil, "no MAC (written by another producer, or by outboxd before it signed its headers)"
	}
	var got [streamMACLen]byte
	if _, err := hex.Decode(got[:], v[i+1:]); err != nil {
		return nil, "no MAC (written by another producer, or by outboxd before it signed its headers)"
	}
	mv.in, mv.sum = streamSum(mv.h, mv.in[:0], mv.sum[:0], topic, partition, mv.mode, v[:i])
	if !hmac.Equal(got[:], mv.sum[:streamMACLen]) {
		return nil, "its MAC does not verify with the stream key (forged, copied from another partition, written under another kafka.stream_key_file, or before kafka.transactions changed)"
	}
	return v[:i], ""
}
