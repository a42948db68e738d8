package boltstore

import (
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
