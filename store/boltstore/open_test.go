package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/storetest"
)

func TestOpenForeignFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	boltFile := func(name string, fn func(*bolt.Tx) error) string {
		p := filepath.Join(dir, name)
		db, err := bolt.Open(p, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fn != nil {
			if err := db.Update(fn); err != nil {
				t.Fatal(err)
			}
		}
		db.Close()
		return p
	}
	random := make([]byte, 64<<10)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	newer := filepath.Join(dir, "newer.db")
	s, err := Open(newer, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(newer, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaVersion, u64(schemaVersion+1)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	for _, tc := range []struct {
		name string
		path string
		want error
	}{
		{"random bytes", write("random.db", random), ErrNotStore},
		{"text file", write("text.db", bytes.Repeat([]byte("hello world\n"), 1000)), ErrNotStore},
		{"short file", write("short.db", make([]byte, 5000)), ErrNotStore},
		{"tiny file", write("tiny.db", []byte("hi")), ErrNotStore},
		{"empty file", write("empty.db", nil), ErrNotStore},
		{"directory", dir, ErrNotStore},
		{"empty bbolt file", boltFile("emptybolt.db", nil), ErrNotStore},
		{"someone else's bbolt file", boltFile("other.db", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("meta"))
			if err != nil {
				return err
			}
			return b.Put([]byte("magic"), []byte("not us"))
		}), ErrNotStore},
		{"newer schema", newer, ErrSchemaTooNew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(tc.path)
			s, err := Open(tc.path, Options{NoSync: true})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open: %v, want %v", err, tc.want)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.path) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q should be one line naming the path", msg)
			}
			if after, _ := os.ReadFile(tc.path); !bytes.Equal(before, after) {
				t.Fatal("Open modified a file it refused")
			}
		})
	}
}

func TestOpenLocked(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	_, err := Open(h.path, Options{NoSync: true, LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}

func TestOptionsRecordedAtCreation(t *testing.T) {
	h := newHarness(t, Options{NoSync: true, SlotWidth: 10 * time.Millisecond, FarWidth: time.Second})
	h.exchange("/", "x")
	h.put(msg("x", base+15, 0, "a"))
	h.opts = Options{NoSync: true} // defaults now differ; the file's widths win
	h.reopen()
	if h.s.slotMs != 10 || h.s.farMs != 1000 {
		t.Fatalf("widths after reopen %d/%d ms, want 10/1000", h.s.slotMs, h.s.farMs)
	}
	if got := bodies(t, h.s, h.keys(0, base+100)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("got %q", got)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{SlotWidth: time.Second, FarWidth: 1500 * time.Millisecond}); err == nil {
		t.Fatal("FarWidth not a multiple of SlotWidth accepted")
	}
}

// TestOpenUpgradesSchema: a version 1 file (no released bucket, no tally),
// a version 2 file (no tally) and a version 3 file (ids keys without their
// epoch) open, gain what they lack and the current version, count their
// tally from the messages (released ones and the far copies of cascaded
// ones left out), find their messages by message-id, and work on.
func TestOpenUpgradesSchema(t *testing.T) {
	const hour = int64(3600_000)
	for _, tc := range []struct {
		version uint64
		release bool // mark some released first (version 1 had no marks)
	}{{1, false}, {2, true}, {3, true}, {4, true}, {5, true}} {
		t.Run(fmt.Sprint("schema ", tc.version), func(t *testing.T) {
			h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour})
			h.exchange("/", "x")
			h.keys(0, base+hour) // slots up to base+1h+1m, far buckets after
			var msgs []*store.Message
			for i := range 40 {
				m := msg("x", base+int64(i)*7*60_000, 0, fmt.Sprint(i)) // over 4.6h
				m.MessageID = fmt.Sprint("id-", i%5)
				msgs = append(msgs, m)
			}
			h.put(msgs...)
			h.keys(0, base+2*hour+30*60_000) // a cascade leaves copies in the far bucket of hour 2
			if tc.release {
				if err := h.s.Delete(context.Background(), msgs[0].Key, msgs[3].Key); err != nil {
					t.Fatal(err)
				}
			}
			bounds := []int64{base + hour, base + 2*hour, base + 3*hour}
			want := h.s.Upcoming(bounds)
			if err := h.s.Close(); err != nil {
				t.Fatal(err)
			}
			tamper(t, h.path, func(tx *bolt.Tx) error {
				if err := withoutIDsGone(tx); err != nil {
					return err
				}
				if tc.version >= 4 {
					return tx.Bucket(bucketMeta).Put(metaVersion, u64(tc.version))
				}
				if err := withoutIDEpochs(tx); err != nil {
					return err
				}
				if tc.version >= 3 {
					return tx.Bucket(bucketMeta).Put(metaVersion, u64(tc.version))
				}
				if tc.version < 2 {
					if err := tx.DeleteBucket(bucketReleased); err != nil {
						return err
					}
				}
				meta := tx.Bucket(bucketMeta)
				if err := meta.DeleteBucket(bucketTally); err != nil {
					return err
				}
				return meta.Put(metaVersion, u64(tc.version))
			})
			h.s = h.open()
			if err := h.s.db.View(func(tx *bolt.Tx) error {
				meta := tx.Bucket(bucketMeta)
				if v, _ := metaU64(meta, metaVersion); v != schemaVersion || tx.Bucket(bucketReleased) == nil || meta.Bucket(bucketTally) == nil || tx.Bucket(bucketIDsGone) == nil {
					t.Errorf("after Open: version %d, released bucket %v, tally %v, ids-gone %v", v, tx.Bucket(bucketReleased) != nil, meta.Bucket(bucketTally) != nil, tx.Bucket(bucketIDsGone) != nil)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if got := h.s.Upcoming(bounds); !slices.Equal(got, want) || want[0] == 0 || want[3] == 0 {
				t.Fatalf("Upcoming after the upgrade %v, before %v", got, want)
			}
			h.check()
			got, err := h.s.Cancel(context.Background(), "/", "x", "id-4")
			if want := []store.Key{msgs[4].Key, msgs[9].Key, msgs[14].Key, msgs[19].Key, msgs[24].Key, msgs[29].Key, msgs[34].Key, msgs[39].Key}; err != nil || !slices.Equal(got, want) {
				t.Fatalf("Cancel by id after the upgrade: %x %v, want %x", got, err, want)
			}
			if err := h.s.Delete(context.Background(), msgs[1].Key); err != nil {
				t.Fatal(err)
			}
			h.reopen()
			if got := bodies(t, h.s, []store.Key{msgs[1].Key, msgs[2].Key}); !slices.Equal(got, []string{"<nil>", "2"}) {
				t.Fatalf("messages after the upgrade: %q", got)
			}
		})
	}
}

// withoutIDsGone deletes the ids entries waiting in ids-gone, and the
// bucket, as versions 1 to 5 had them: deleted with their messages.
func withoutIDsGone(tx *bolt.Tx) error {
	ids := tx.Bucket(bucketIDs)
	if err := tx.Bucket(bucketIDsGone).ForEach(func(_, v []byte) error {
		return ids.Delete(v)
	}); err != nil {
		return err
	}
	return tx.DeleteBucket(bucketIDsGone)
}

// withoutIDEpochs rewrites the ids index as versions 1 to 3 kept it, its
// keys without the leading epoch.
func withoutIDEpochs(tx *bolt.Tx) error {
	var keys [][]byte
	if err := tx.Bucket(bucketIDs).ForEach(func(k, _ []byte) error {
		keys = append(keys, k[idEpochSize:])
		return nil
	}); err != nil {
		return err
	}
	if err := tx.DeleteBucket(bucketIDs); err != nil {
		return err
	}
	bk, err := tx.CreateBucket(bucketIDs)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := bk.Put(k, nil); err != nil {
			return err
		}
	}
	return nil
}

// fileWithMessage makes a closed store file holding one message of exchange
// x, due at due; with the watermark moved to slotsBelow first, so that a due
// before it lands in a slot.
func fileWithMessage(t *testing.T, due, slotsBelow int64) (string, store.Key) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.db")
	s, err := Open(path, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.Exchange(t, s, "/", "x")
	storetest.Keys(t, s, 0, slotsBelow)
	m := msg("x", due, 0, "m")
	storetest.Put(t, s, m)
	return path, m.Key
}

// tamper changes a closed store file directly, with bbolt.
func tamper(t *testing.T, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}
