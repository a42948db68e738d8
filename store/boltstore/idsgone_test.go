package boltstore

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// idsFile counts, in the store's file as committed, the ids entries and
// those of them waiting in ids-gone.
func idsFile(t *testing.T, s *Store) (ids, gone int) {
	t.Helper()
	if err := s.db.View(func(tx *bolt.Tx) error {
		ids = tx.Bucket(bucketIDs).Stats().KeyN
		gone = tx.Bucket(bucketIDsGone).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ids, gone
}

// TestIDsGoneWaitThenGoWhenIdle takes messages with a message-id out every
// way a message leaves (released from a slot, released from a far bucket,
// cancelled by key, by message-id, with its exchange's messages): each
// leaves its ids entry waiting in ids-gone, a cancel by message-id does not
// find it, Check proves the index, and the waiting entries survive a crash.
// Once the writer is idle, they are deleted.
func TestIDsGoneWaitThenGoWhenIdle(t *testing.T) {
	const hour = int64(3600_000)
	h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour})
	h.s.idleCheckpoint = 0 // keep them waiting until the copy below
	ctx := context.Background()
	x, y := h.exchange("/", "x"), h.exchange("/", "y")
	h.keys(0, base+hour) // slots up to base+1h+1m, far buckets after
	var msgs []*store.Message
	for i := range 40 {
		ex := x
		if i >= 36 {
			ex = y
		}
		m := msg(ex.Name, base+int64(i)*7*60_000, 0, fmt.Sprint(i)) // over 4.6h
		m.Incarnation, m.MessageID = ex.Incarnation, fmt.Sprint("id-", i%4)
		msgs = append(msgs, m)
	}
	h.put(msgs...)
	// Released: 0 and 4 from slots, 20 from a far bucket.
	if err := h.s.Delete(ctx, msgs[0].Key, msgs[4].Key, msgs[20].Key); err != nil {
		t.Fatal(err)
	}
	if ok, err := h.s.CancelKey(ctx, msgs[5].Key); !ok || err != nil {
		t.Fatalf("CancelKey: %v %v", ok, err)
	}
	// id-0 of x: 8, 12, ..., 32 are pending; 0, 4 and 20 are gone.
	got, err := h.s.Cancel(ctx, "/", "x", "id-0")
	if want := []store.Key{msgs[8].Key, msgs[12].Key, msgs[16].Key, msgs[24].Key, msgs[28].Key, msgs[32].Key}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Cancel id-0: %x %v, want %x", got, err, want)
	}
	if n, err := h.s.CancelExchange(ctx, "/", "y"); n != 4 || err != nil {
		t.Fatalf("CancelExchange y: %d %v", n, err)
	}
	// The cancelled exchange's messages stay stored (stale) until deleted.
	var stale []store.Key
	for _, m := range msgs[36:] {
		stale = append(stale, m.Key)
	}
	if err := h.s.Delete(ctx, stale...); err != nil {
		t.Fatal(err)
	}
	const taken = 3 + 1 + 6 + 4
	if ids, gone := idsFile(t, h.s); ids != 40 || gone != taken {
		t.Fatalf("ids index %d entries, %d in ids-gone; want 40, %d", ids, gone, taken)
	}
	if got, err := h.s.Cancel(ctx, "/", "x", "id-0"); err != nil || len(got) != 0 {
		t.Fatalf("Cancel id-0 again: %x %v, want none", got, err)
	}
	h.check()

	crashed := filepath.Join(t.TempDir(), "crashed.db")
	copyFile(t, h.path, crashed)
	for i := range 2 {
		copyFile(t, journalPath(h.path, i), journalPath(crashed, i))
	}
	s, err := Open(crashed, Options{NoSync: true, FarWidth: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ids, gone := idsFile(t, s)
		if gone == 0 {
			if ids != 40-taken {
				t.Fatalf("ids index %d entries once ids-gone is empty, want %d", ids, 40-taken)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ids entries still waiting after 10 s idle", gone)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Cancel(ctx, "/", "x", "id-1"); err != nil || len(got) != 8 { // 1, 9, 13, ..., 33; 5 was cancelled
		t.Fatalf("Cancel id-1 after the drop: %x %v, want 8 keys", got, err)
	}
}

// TestIDsGoneBeyondTheBoundGoInTheSameCommit lowers the bound of waiting ids
// entries: a commit that would leave more deletes the oldest of them.
func TestIDsGoneBeyondTheBoundGoInTheSameCommit(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.s.idleCheckpoint = 0
	h.s.idsGoneMax = 5
	x := h.exchange("/", "x")
	h.keys(0, base+3600_000)
	var msgs []*store.Message
	for i := range 20 {
		m := msg("x", base+int64(i)*1000, 0, "b")
		m.Incarnation, m.MessageID = x.Incarnation, fmt.Sprint("id-", i)
		msgs = append(msgs, m)
	}
	h.put(msgs...)
	for i, tc := range []struct {
		del      []int
		ids      int // entries in the index after the delete
		gone     int // of them waiting
		firstDel int // the oldest waiting entry's message
	}{
		{[]int{0, 1, 2}, 20, 3, 0},
		{[]int{3, 4, 5, 6}, 18, 5, 2}, // 7 waiting: the 2 oldest go
		{[]int{7, 8, 9, 10, 11, 12, 13}, 11, 5, 9},
	} {
		var keys []store.Key
		for _, j := range tc.del {
			keys = append(keys, msgs[j].Key)
		}
		if err := h.s.Delete(context.Background(), keys...); err != nil {
			t.Fatal(err)
		}
		ids, gone := idsFile(t, h.s)
		if ids != tc.ids || gone != tc.gone {
			t.Fatalf("step %d: ids %d, ids-gone %d; want %d, %d", i, ids, gone, tc.ids, tc.gone)
		}
		if err := h.s.db.View(func(tx *bolt.Tx) error {
			_, v := tx.Bucket(bucketIDsGone).Cursor().First()
			if want := idKey([]byte("/"), []byte("x"), []byte(msgs[tc.firstDel].MessageID), msgs[tc.firstDel].Key); string(v) != string(want) {
				t.Errorf("step %d: oldest waiting %x, want that of message %d", i, v, tc.firstDel)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		h.check()
	}
}
