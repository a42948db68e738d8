package boltstore

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// slotState reads what a slot physically holds: entries, released marks,
// and whether its buckets exist.
func slotState(t *testing.T, s *Store, idx int64) (entries, marks int, slot, rel bool) {
	t.Helper()
	if err := s.db.View(func(tx *bolt.Tx) error {
		if bk := tx.Bucket(bucketSlots).Bucket(u64(uint64(idx))); bk != nil {
			slot, entries = true, keyCount(bk)
		}
		if rb := tx.Bucket(bucketReleased).Bucket(u64(uint64(idx))); rb != nil {
			rel, marks = true, keyCount(rb)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return entries, marks, slot, rel
}

// TestReleaseMarksInSlot: deleting messages of a slot marks them released
// instead of rewriting the slot: readers, counts and the ids index lose them
// at once, the slot keeps its pages, marks survive a reopen, and the slot
// goes whole with its last message.
func TestReleaseMarksInSlot(t *testing.T) {
	const n = 2000
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	h.keys(0, base) // watermark past base: these land in one slot
	idx := (base - 5000) / 1000
	r := rand.New(rand.NewPCG(3, 4))
	var msgs []*store.Message
	for i := range n {
		m := msg("x", idx*1000+r.Int64N(1000), uint8(r.IntN(10)), fmt.Sprint(i))
		m.Body = fmt.Appendf(nil, "%-200d", i) // the slot spans over 100 pages
		if i%100 == 0 {
			m.MessageID = fmt.Sprint("id-", i) // a few: ids keys are random
		}
		msgs = append(msgs, m)
	}
	h.put(msgs...)
	keys := make([]store.Key, n)
	for i, m := range msgs {
		keys[i] = m.Key
	}
	slices.SortFunc(keys, store.CompareKeys) // release order: spread over the slot's pages
	ctx := context.Background()

	if err := h.s.settle(); err != nil { // the Puts' checkpoint is not what is measured
		t.Fatal(err)
	}
	before := h.s.Stats()
	released := keys[:n/4]
	if err := h.s.Delete(ctx, released...); err != nil {
		t.Fatal(err)
	}
	writes := h.s.Stats().PageWrites - before.PageWrites
	entries, marks, slot, rel := slotState(t, h.s, idx)
	if !slot || !rel || entries != n || marks != n/4 {
		t.Fatalf("after releasing %d of %d: slot %v with %d entries, released bucket %v with %d marks", n/4, n, slot, entries, rel, marks)
	}
	// Deleting in place rewrote nearly every leaf of the slot; marks
	// append to a bucket of their own.
	var slotPages int
	if err := h.s.db.View(func(tx *bolt.Tx) error {
		slotPages = tx.Bucket(bucketSlots).Bucket(u64(uint64(idx))).Stats().LeafPageN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if writes > uint64(slotPages/4) {
		t.Errorf("releasing %d messages wrote %d pages; the slot has %d leaf pages", n/4, writes, slotPages)
	}
	t.Logf("releasing %d of %d messages wrote %d pages; the slot has %d leaf pages", n/4, n, writes, slotPages)

	check := func(when string) {
		t.Helper()
		if got := h.s.Pending(); got != n-int64(len(released)) {
			t.Fatalf("%s: Pending %d, want %d", when, got, n-len(released))
		}
		got := h.keys(0, base)
		if want := keys[len(released):]; !slices.Equal(got, want) {
			t.Fatalf("%s: ScanKeys returned %d keys, want the %d unreleased", when, len(got), len(want))
		}
		if b := bodies(t, h.s, released[:2]); !slices.Equal(b, []string{"<nil>", "<nil>"}) {
			t.Fatalf("%s: Get of released keys: %q", when, b)
		}
		if due, ok := h.s.NextDue(); !ok || due != keys[len(released)].Due() {
			t.Fatalf("%s: NextDue %d %v, want %d", when, due, ok, keys[len(released)].Due())
		}
		page, err := h.s.List("/", "x", store.Key{}, 1, false)
		if err != nil || len(page) != 1 || page[0].Key != keys[len(released)] {
			t.Fatalf("%s: List first page %v %v, want key %x", when, page, err, keys[len(released)])
		}
		if ok, err := h.s.CancelKey(ctx, released[0]); ok || err != nil {
			t.Fatalf("%s: CancelKey of a released message: %v %v", when, ok, err)
		}
		h.check()
	}
	check("after the first release")
	h.reopen()
	check("after reopening")

	// A cancel marks too; releasing the rest drops the slot whole.
	var victim *store.Message
	for _, m := range msgs {
		if m.MessageID != "" && slices.Index(released, m.Key) < 0 {
			victim = m
		}
	}
	if got, err := h.s.Cancel(ctx, "/", "x", victim.MessageID); !slices.Equal(got, []store.Key{victim.Key}) || err != nil {
		t.Fatalf("Cancel by id: %x %v", got, err)
	}
	if got, err := h.s.Cancel(ctx, "/", "x", victim.MessageID); len(got) != 0 || err != nil {
		t.Fatalf("Cancel by id again: %x %v", got, err)
	}
	if err := h.s.Delete(ctx, keys[len(released):]...); err != nil {
		t.Fatal(err)
	}
	if entries, marks, slot, rel := slotState(t, h.s, idx); slot || rel {
		t.Fatalf("every message released: slot %v (%d entries), released bucket %v (%d marks) left", slot, entries, rel, marks)
	}
	if h.s.Pending() != 0 {
		t.Fatalf("Pending %d after releasing everything", h.s.Pending())
	}
	if len(h.s.slotCounts) != 0 {
		t.Fatalf("counts left for dropped slots: %v", h.s.slotCounts)
	}
}

// TestReleaseMarksModel runs random puts (into slots, some with marks
// already, and far buckets), deletes (repeated and missing keys too) and
// reopens against a model: after every step the store holds exactly the
// model's messages, and once everything is deleted no slot and no mark is
// left. Slots are 10 ms wide so that many fill, drain and drop.
func TestReleaseMarksModel(t *testing.T) {
	h := newHarness(t, Options{NoSync: true, SlotWidth: 10 * time.Millisecond, FarWidth: time.Second})
	h.exchange("/", "x")
	h.keys(0, base+500) // watermark past base+500: earlier dues go to slots
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 6))
	model := map[store.Key]bool{}
	var all []store.Key
	put := func(n int) {
		var msgs []*store.Message
		for range n {
			due := base + r.Int64N(400) // 40 slots
			if r.IntN(10) == 0 {
				due = base + 5000 + r.Int64N(2000) // beyond the watermark: far
			}
			m := msg("x", due, uint8(r.IntN(3)), "m")
			if r.IntN(4) == 0 {
				m.MessageID = fmt.Sprint("id-", r.IntN(50))
			}
			msgs = append(msgs, m)
		}
		h.put(msgs...)
		for _, m := range msgs {
			model[m.Key] = true
			all = append(all, m.Key)
		}
	}
	del := func(n int) {
		var keys []store.Key
		for range n {
			k := all[r.IntN(len(all))] // pending, deleted before, or far
			if r.IntN(20) == 0 {
				k = store.MakeKey(base+r.Int64N(400), 0, 1<<40) // never stored
			}
			keys = append(keys, k)
		}
		if err := h.s.Delete(ctx, keys...); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			delete(model, k)
		}
	}
	verify := func(step int) {
		t.Helper()
		want := slices.Collect(maps.Keys(model))
		slices.SortFunc(want, store.CompareKeys)
		got := h.keys(0, base+500)
		var wantSlots []store.Key
		for _, k := range want {
			if k.Due() < base+500 {
				wantSlots = append(wantSlots, k)
			}
		}
		if !slices.Equal(got, wantSlots) {
			t.Fatalf("step %d: ScanKeys has %d keys, the model %d", step, len(got), len(wantSlots))
		}
		if p := h.s.Pending(); p != int64(len(model)) {
			t.Fatalf("step %d: Pending %d, model %d", step, p, len(model))
		}
		h.check()
	}
	for step := range 60 {
		put(1 + r.IntN(200))
		del(1 + r.IntN(250))
		if step%15 == 14 {
			h.reopen() // the slot counts in memory start over
		}
		verify(step)
	}
	if err := h.s.Delete(ctx, all...); err != nil {
		t.Fatal(err)
	}
	clear(model)
	verify(60)
	if err := h.s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketSlots).Cursor().First(); k != nil {
			t.Errorf("slot %x left after every message was deleted", k)
		}
		if k, _ := tx.Bucket(bucketReleased).Cursor().First(); k != nil {
			t.Errorf("released bucket %x left after every message was deleted", k)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
