package boltstore

import bolt "go.etcd.io/bbolt"

// releasedMark is the value of a released mark: not empty, since bbolt's
// Get answers nil for an empty value written in the same transaction.
var releasedMark = []byte{1}

// releasedBucket opens (or creates) the released bucket of slot idx.
func (b *batch) releasedBucket(idx int64, create bool) (*bolt.Bucket, error) {
	return nested(b.released, b.relB, idx, create)
}

// slotCount is what a slot with released messages holds.
type slotCount struct {
	entries, marks int
	dropped        bool // in a batch overlay: the slot is gone
}

// slotCount is the count of slot idx through the batch overlay; ok is false
// when it has not been counted (no mark since Open).
func (b *batch) slotCount(idx int64) (slotCount, bool) {
	if c, ok := b.sc[idx]; ok {
		return c, !c.dropped
	}
	c, ok := b.s.slotCounts[idx]
	return c, ok
}

// keyCount is the number of keys in b (a walk over its leaves).
func keyCount(b *bolt.Bucket) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}
