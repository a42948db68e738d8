package boltstore

import (
	"cmp"
	"container/heap"
	"context"
	"math"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// cascadePassMax bounds the messages one cascade pass moves (and keeps in
// memory), after the bbolt advice of at most ~100k inserts per transaction.
const cascadePassMax = 100_000 // Store.passMax

// A cascade pass moves the messages of one far bucket due in [from, hi)
// into slots and sets the watermark to the end of what it moved. The scan
// of the far bucket (keys only, the whole bucket) runs in its own goroutine
// on a read transaction, so commits go on meanwhile; far Puts committed in
// the range during the scan are noted as late and moved with the rest. The
// move itself is one short write transaction in the writer.

// cascadeScan is the pass in progress (writer-only state).
type cascadeScan struct {
	from int64       // watermark when the scan began
	hi   int64       // the scan covers due times in [from, hi)
	late []store.Key // far Puts committed in [from, hi) after the scan's snapshot
	done chan scanResult
}

type scanResult struct {
	keys  []store.Key // sorted
	limit int64       // the pass moves everything due before limit
}

// cascadeStep releases the waiters whose target the watermark has reached
// and starts a pass toward the furthest target when none is running. err is
// the outcome of a pass that just ended: when it failed, every waiter fails.
func (s *Store) cascadeStep(waiting []*request, open bool, err error) []*request {
	if len(waiting) == 0 {
		return nil
	}
	switch {
	case err != nil: // the pass that just ended failed: so does every waiter
	case !open:
		err = store.ErrClosed
	case s.scan == nil:
		target := int64(0)
		for _, r := range waiting {
			target = max(target, r.target)
		}
		if s.watermark < target {
			err = s.startCascade(target)
		}
	}
	kept := waiting[:0]
	for _, r := range waiting {
		switch {
		case err != nil:
			r.err = err
		case r.ctx.Err() != nil:
			r.err = r.ctx.Err()
		case s.watermark < r.target:
			kept = append(kept, r)
			continue
		}
		close(r.done)
	}
	return kept
}

// startCascade begins a pass toward target. When no far bucket lies before
// target it just moves the watermark.
func (s *Store) startCascade(target int64) error {
	target = s.roundUp(target)
	w := s.watermark
	tx, err := s.db.Begin(false)
	if err != nil {
		return commitError(err)
	}
	far := tx.Bucket(bucketFar)
	fk, _ := far.Cursor().Seek(u64(uint64(w / s.farMs)))
	if fk == nil || int64(beUint64(fk))*s.farMs >= target {
		tx.Rollback()
		s.scan = &cascadeScan{from: w, hi: target}
		return s.moveCascade(scanResult{limit: target})
	}
	idx := int64(beUint64(fk))
	lo, hi := max(w, idx*s.farMs), min(target, (idx+1)*s.farMs)
	sc := &cascadeScan{from: w, hi: hi, done: make(chan scanResult, 1)}
	s.scan = sc
	fb := far.Bucket(fk)
	go func() {
		defer tx.Rollback()
		if s.scanHook != nil {
			s.scanHook()
		}
		keys, limit := s.collect(fb, lo, hi)
		sc.done <- scanResult{keys, limit}
	}()
	return nil
}

// moveCascade writes the scanned and late messages due before res.limit
// into slots, drops the far buckets the watermark passes and moves the
// watermark, in one transaction.
func (s *Store) moveCascade(res scanResult) error {
	start := time.Now()
	sc := s.scan
	s.scan = nil
	keys := res.keys
	if len(sc.late) > 0 {
		for _, k := range sc.late {
			if k.Due() < res.limit {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, store.CompareKeys)
		keys = slices.Compact(keys)
	}
	// Fill each slot in sequence order: every insert appends.
	slices.SortFunc(keys, func(a, b store.Key) int {
		if c := cmp.Compare(a.Due()/s.slotMs, b.Due()/s.slotMs); c != 0 {
			return c
		}
		return cmp.Compare(a.Seq(), b.Seq())
	})
	tx, err := s.db.Begin(true)
	if err != nil {
		return commitError(err)
	}
	defer tx.Rollback()
	far, slots := tx.Bucket(bucketFar), tx.Bucket(bucketSlots)
	moved := 0
	var fb, bk *bolt.Bucket
	fcur, scur := int64(-1), int64(-1)
	for _, k := range keys {
		due := k.Due()
		if idx := due / s.farMs; idx != fcur {
			fb, fcur = far.Bucket(u64(uint64(idx))), idx
		}
		if fb == nil {
			continue
		}
		v := fb.Get(storedKey(k))
		if v == nil {
			continue // deleted during the scan
		}
		if idx := due / s.slotMs; idx != scur {
			if bk, err = slots.CreateBucketIfNotExists(u64(uint64(idx))); err != nil {
				return commitError(err)
			}
			bk.FillPercent = 1 // filled in sequence order
			scur = idx
		}
		if err := bk.Put(storedKey(k), v); err != nil {
			return commitError(err)
		}
		moved++
	}
	var behind [][]byte
	c := far.Cursor()
	for fk, _ := c.First(); fk != nil && (int64(beUint64(fk))+1)*s.farMs <= res.limit; fk, _ = c.Next() {
		behind = append(behind, slices.Clone(fk))
	}
	for _, fk := range behind {
		if err := far.DeleteBucket(fk); err != nil {
			return commitError(err)
		}
	}
	if err := tx.Bucket(bucketMeta).Put(metaWatermark, u64(uint64(res.limit))); err != nil {
		return commitError(err)
	}
	if err := tx.Commit(); err != nil {
		return commitError(err)
	}
	s.mu.Lock()
	s.watermark = res.limit
	if moved > 0 {
		s.farMinOK = false
	}
	s.mu.Unlock()
	s.statsMu.Lock()
	s.stats.Cascades++
	s.stats.CascadedMessages += uint64(moved)
	s.stats.CascadeTime += time.Since(start)
	s.statsMu.Unlock()
	return nil
}

// collect returns, sorted, the keys of fb due in [lo, hi) and the end of
// the range they cover: hi, or an earlier slot boundary when more than
// passMax messages are due in [lo, hi). A single slot is always taken whole.
func (s *Store) collect(fb *bolt.Bucket, lo, hi int64) ([]store.Key, int64) {
	h := &keyHeap{}
	evicted := int64(math.MaxInt64) // earliest due among keys dropped from the heap
	c := fb.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		due := storedDue(k)
		if due < lo || due >= hi || due >= evicted {
			continue
		}
		heap.Push(h, keyFromStored(k))
		if h.Len() > s.passMax {
			evicted = min(evicted, heap.Pop(h).(store.Key).Due())
		}
	}
	keys := []store.Key(*h)
	if evicted == math.MaxInt64 {
		slices.SortFunc(keys, store.CompareKeys)
		return keys, hi
	}
	limit := evicted / s.slotMs * s.slotMs
	if limit <= lo {
		// One slot holds more than passMax messages: take it whole.
		limit = lo + s.slotMs
		keys = keys[:0]
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if due := storedDue(k); due >= lo && due < limit {
				keys = append(keys, keyFromStored(k))
			}
		}
	} else {
		keys = slices.DeleteFunc(keys, func(k store.Key) bool { return k.Due() >= limit })
	}
	slices.SortFunc(keys, store.CompareKeys)
	return keys, limit
}

// cascadeTo makes sure every message due before until sits in a slot.
func (s *Store) cascadeTo(until int64) error {
	s.mu.RLock()
	w := s.watermark
	s.mu.RUnlock()
	if until <= w {
		return nil
	}
	target := maxDue
	if until < maxDue-s.leadMs {
		target = s.roundUp(until + s.leadMs)
	}
	return s.do(context.Background(), &request{kind: opCascade, target: target})
}
