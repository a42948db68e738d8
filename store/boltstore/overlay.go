package boltstore

import (
	"iter"
	"math"

	"github.com/delayproxy/delayproxy/store"
)

// overlay holds the messages journaled since the last checkpoint: durable
// in the journal, not yet in bbolt. Readers see them through it: Get by
// key, the counts, NextDue. Reads that walk bbolt (ScanKeys, List, Counts'
// due times, Upcoming, Check) checkpoint first. The writer changes it
// under Store.mu; a checkpoint empties it in the commit's applyCommitted,
// so a reader never sees a message in both places or in neither.
type overlay struct {
	items  []putItem         // in journal order
	byKey  map[store.Key]int // index into items
	counts map[uint64]int64  // messages per incarnation
	live   int64             // messages of live incarnations
	stale  int64             // messages of the others
	minDue int64             // earliest due (math.MaxInt64 when empty)
}

func newOverlay() overlay {
	return overlay{byKey: make(map[store.Key]int), counts: make(map[uint64]int64), minDue: math.MaxInt64}
}

// add records journaled messages; live tells whether an incarnation is
// live (exchange changes checkpoint first, so it stays true while the
// messages are here).
func (o *overlay) add(items []putItem, live func(inc uint64) bool) {
	for i := range items {
		p := &items[i]
		o.byKey[p.key] = len(o.items)
		o.items = append(o.items, *p)
		o.counts[p.inc]++
		if live(p.inc) {
			o.live++
		} else {
			o.stale++
		}
		o.minDue = min(o.minDue, p.key.Due())
	}
}

// all are the layer's messages, in journal order.
func (o *overlay) all() iter.Seq[*putItem] {
	return func(yield func(*putItem) bool) {
		for i := range o.items {
			if !yield(&o.items[i]) {
				return
			}
		}
	}
}

// get returns the encoded message of k, nil when k is not here.
func (o *overlay) get(k store.Key) []byte {
	if i, ok := o.byKey[k]; ok {
		return o.items[i].val
	}
	return nil
}

// reset empties the overlay after a checkpoint, keeping its storage.
func (o *overlay) reset() {
	clear(o.items) // drop the messages' bytes
	o.items = o.items[:0]
	clear(o.byKey)
	clear(o.counts)
	o.live, o.stale, o.minDue = 0, 0, math.MaxInt64
}

// overlays are the journaled messages in two layers: frozen, the
// generation a checkpoint is writing into bbolt in the background, and
// active, the generation the journal appends to. Readers see both.
type overlays struct{ frozen, active overlay }

func newOverlays() overlays { return overlays{newOverlay(), newOverlay()} }

// len is the number of journaled messages.
func (o *overlays) len() int { return len(o.frozen.items) + len(o.active.items) }

// get returns the encoded message of k, nil when k is not journaled.
func (o *overlays) get(k store.Key) []byte {
	if v := o.active.get(k); v != nil {
		return v
	}
	return o.frozen.get(k)
}

// live and stale count the journaled messages of live and other
// incarnations; count those of one incarnation.
func (o *overlays) live() int64            { return o.frozen.live + o.active.live }
func (o *overlays) stale() int64           { return o.frozen.stale + o.active.stale }
func (o *overlays) count(inc uint64) int64 { return o.frozen.counts[inc] + o.active.counts[inc] }

// minDue is the earliest due of a journaled message (math.MaxInt64: none).
func (o *overlays) minDue() int64 { return min(o.frozen.minDue, o.active.minDue) }

// items are the journaled messages, frozen ones first (journal order).
func (o *overlays) items() iter.Seq[*putItem] {
	return func(yield func(*putItem) bool) {
		for p := range o.frozen.all() {
			if !yield(p) {
				return
			}
		}
		for p := range o.active.all() {
			if !yield(p) {
				return
			}
		}
	}
}

// freeze makes the active layer the frozen one, for a checkpoint in the
// background; the frozen layer must be empty. Callers hold Store.mu.
func (o *overlays) freeze() {
	o.frozen, o.active = o.active, o.frozen
}
