package boltstore

import (
	"context"
	"math"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// NextDue is the earliest due time of any stored message (stale ones
// included): the earlier of the journaled messages' (kept in memory) and
// bbolt's. For bbolt it usually reads the first slot (one slot width of
// messages); when every message lies beyond the watermark it asks the
// writer, which keeps the earliest far due cached (a scan of one far bucket
// when the cache was invalidated). false when nothing is stored or the
// store is closed.
func (s *Store) NextDue() (int64, bool) {
	s.mu.RLock()
	journaled := s.ov.minDue() // read first: a checkpoint moves messages into bbolt, never out
	s.mu.RUnlock()
	due, ok := s.storedNextDue()
	if journaled != math.MaxInt64 && (!ok || journaled < due) {
		if s.isClosed() {
			return 0, false
		}
		return journaled, true
	}
	return due, ok
}

// storedNextDue is NextDue over bbolt alone.
func (s *Store) storedNextDue() (int64, bool) {
	var due int64
	var ok bool
	if err := s.view(func(tx *bolt.Tx) error {
		due, ok = s.firstSlotDue(tx)
		return nil
	}); err != nil || ok {
		return due, ok
	}
	r := &request{kind: opNextDue}
	if err := s.do(context.Background(), r); err != nil {
		return 0, false
	}
	return r.n, r.ok
}

// nextDueExact computes the earliest due over slots and far buckets. It runs
// in the writer between commits, so the two halves see the same state.
func (s *Store) nextDueExact() (int64, bool, error) {
	var due int64
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		due, ok = s.firstSlotDue(tx)
		if ok {
			return nil
		}
		if !s.farMinOK {
			s.mu.Lock()
			s.farMin = farMinimum(tx, s.watermark, s.farMs)
			s.farMinOK = true
			s.mu.Unlock()
		}
		due, ok = s.farMin, s.farMin != math.MaxInt64
		return nil
	})
	return due, ok, err
}

// firstSlotDue is the earliest due time of an unreleased message in slots:
// the first key scanSlots yields (it reads the first slot that holds one).
func (s *Store) firstSlotDue(tx *bolt.Tx) (due int64, ok bool) {
	_ = s.scanSlots(tx, 0, maxDue, func(k, _ []byte) error {
		due, ok = store.Key(k).Due(), true
		return store.ErrStop
	})
	return due, ok
}

// farMinimum scans far buckets in order for the earliest due at or after w
// (the first non-empty bucket decides). math.MaxInt64 when there is none.
func farMinimum(tx *bolt.Tx, w, farMs int64) int64 {
	far := tx.Bucket(bucketFar)
	c := far.Cursor()
	for fk, _ := c.Seek(u64(uint64(w / farMs))); fk != nil; fk, _ = c.Next() {
		m := int64(math.MaxInt64)
		bc := far.Bucket(fk).Cursor()
		for k, _ := bc.First(); k != nil; k, _ = bc.Next() {
			if d := storedDue(k); d >= w && d < m {
				m = d
			}
		}
		if m != math.MaxInt64 {
			return m
		}
	}
	return math.MaxInt64
}
