package sink

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestLoadStreamKey: the first start makes the key file (mode 0600, 32
// random bytes in hex), later ones read the same key; instances starting
// at once agree on one key; a file too short or unreadable is an error; a
// directory where no file can be made says so with ErrStreamKeyNotKept.
func TestLoadStreamKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outboxd-stream.key")
	key, created, err := LoadStreamKey(path)
	if err != nil || !created || len(key) != 64 {
		t.Fatalf("first LoadStreamKey: %d bytes, created %v, %v; want 64, true, nil", len(key), created, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the key file: %v, %v; want mode 0600", fi, err)
	}
	again, created, err := LoadStreamKey(path)
	if err != nil || created || !bytes.Equal(again, key) {
		t.Errorf("second LoadStreamKey: created %v, %v, same key %v; want the same key read", created, err, bytes.Equal(again, key))
	}

	race := filepath.Join(dir, "race.key")
	keys := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, _, err := LoadStreamKey(race)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for i := range keys {
		if !bytes.Equal(keys[i], keys[0]) {
			t.Errorf("instance %d started at once with the others has another key", i)
		}
	}

	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadStreamKey(short); err == nil || errors.Is(err, ErrStreamKeyNotKept) {
		t.Errorf("a 10-byte key: %v, want an error that is not ErrStreamKeyNotKept", err)
	}
	mounted := filepath.Join(dir, "mounted.key")
	if err := os.WriteFile(mounted, []byte("  a secret of more than sixteen bytes \n"), 0o400); err != nil {
		t.Fatal(err)
	}
	if k, created, err := LoadStreamKey(mounted); err != nil || created || string(k) != "a secret of more than sixteen bytes" {
		t.Errorf("a mounted key: %q, created %v, %v; want its content without the white space around it", k, created, err)
	}

	if _, _, err := LoadStreamKey(filepath.Join(dir, "no such directory", "k")); !errors.Is(err, ErrStreamKeyNotKept) {
		t.Errorf("a key file that cannot be made: %v, want ErrStreamKeyNotKept", err)
	}

	// CheckStreamKey (outboxd check) says the same and makes nothing.
	for _, tc := range []struct {
		path    string
		exists  bool
		notKept bool
		bad     bool
	}{
		{path, true, false, false},
		{filepath.Join(dir, "absent.key"), false, false, false},
		{short, true, false, true},
		{filepath.Join(dir, "no such directory", "k"), false, true, true},
	} {
		exists, err := CheckStreamKey(tc.path)
		if exists != tc.exists || (err != nil) != tc.bad || errors.Is(err, ErrStreamKeyNotKept) != tc.notKept {
			t.Errorf("CheckStreamKey(%s) = %v, %v; want exists %v, error %v (not kept %v)", tc.path, exists, err, tc.exists, tc.bad, tc.notKept)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*absent*")); len(left) > 0 {
		t.Errorf("CheckStreamKey left %v", left)
	}
}
