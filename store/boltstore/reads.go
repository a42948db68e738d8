package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// Get reads messages by key: the journaled ones from memory, then the
// others in one read transaction. The result has one entry per key, nil
// for a key that is not stored. The journal comes first: a message that a
// checkpoint moves meanwhile is in bbolt by the time the transaction
// begins.
func (s *Store) Get(keys []store.Key) ([]*store.Message, error) {
	out := make([]*store.Message, len(keys))
	vals := make([][]byte, len(keys))
	s.mu.RLock()
	journaled := 0
	for i, k := range keys {
		if vals[i] = s.ov.get(k); vals[i] != nil {
			journaled++
		}
	}
	s.mu.RUnlock()
	err := s.view(func(tx *bolt.Tx) error {
		w := readWatermark(tx)
		for i, k := range keys {
			v := vals[i]
			if v == nil && journaled < len(keys) {
				v = s.lookup(tx, w, k)
			}
			if v == nil {
				continue
			}
			m, err := decodeMessage(k, v, true)
			if err != nil {
				return fmt.Errorf("key %x: %w", k[:], err)
			}
			out[i] = m
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// settle asks the writer for a checkpoint when messages are journaled, so
// that a read of bbolt after it sees every Put that returned before it.
func (s *Store) settle() error {
	s.mu.RLock()
	n := s.ov.len()
	s.mu.RUnlock()
	if n == 0 {
		return nil
	}
	return s.do(context.Background(), &request{kind: opCheckpoint})
}

// lookup finds the stored value of k in tx (nil if absent or released).
func (s *Store) lookup(tx *bolt.Tx, w int64, k store.Key) []byte {
	due := k.Due()
	if due < w {
		sk := s.slotKey(due)
		bk := tx.Bucket(bucketSlots).Bucket(sk)
		if bk == nil {
			return nil
		}
		if rb := tx.Bucket(bucketReleased).Bucket(sk); rb != nil && rb.Get(k[:]) != nil {
			return nil
		}
		return bk.Get(storedKey(k))
	}
	if bk := tx.Bucket(bucketFar).Bucket(s.farBucketKey(due)); bk != nil {
		return bk.Get(storedKey(k))
	}
	return nil
}

// ScanKeys implements store.Store. It first moves the cascade watermark
// past until (a write that sorts far buckets into slots, see cascade.go),
// then reads the slots of the range one at a time, in key order.
func (s *Store) ScanKeys(from, until int64, fn func(store.Key) error) error {
	from = max(from, 0)
	until = min(until, maxDue)
	if until <= from {
		return nil
	}
	if err := s.settle(); err != nil {
		return err
	}
	if err := s.cascadeTo(until); err != nil {
		return err
	}
	return s.view(func(tx *bolt.Tx) error {
		err := s.scanSlots(tx, from, until, func(k, _ []byte) error { return fn(store.Key(k)) })
		if errors.Is(err, store.ErrStop) {
			return nil
		}
		return err
	})
}

// slotEntry is one message of a slot, sorted in memory.
type slotEntry struct {
	k store.Key
	v []byte
}

// scanSlots calls fn for every slot entry due in [from, until) in key order,
// released ones left out, and returns fn's first error as is. A slot holds
// its keys in sequence order, so each slot is read whole and ordered in
// memory: memory is bounded by the messages due within one slot width, not
// by the pending count. The order comes from a heap popped as fn consumes,
// so a caller that stops early (ErrStop after a chunk) pays O(slot) per
// call, not a full sort.
func (s *Store) scanSlots(tx *bolt.Tx, from, until int64, fn func(k, v []byte) error) error {
	slots, released := tx.Bucket(bucketSlots), tx.Bucket(bucketReleased)
	c := slots.Cursor()
	var h slotHeap
	for sk, _ := c.Seek(u64(uint64(from / s.slotMs))); sk != nil; sk, _ = c.Next() {
		if int64(beUint64(sk))*s.slotMs >= until {
			return nil
		}
		h = h[:0]
		ic := slots.Bucket(sk).Cursor()
		for f, v := ic.First(); f != nil; f, v = ic.Next() {
			if due := storedDue(f); due >= from && due < until {
				h = append(h, slotEntry{keyFromStored(f), v})
			}
		}
		h.init()
		// Released marks are in key order too: walk them alongside.
		var mc *bolt.Cursor
		var mark []byte
		if rb := released.Bucket(sk); rb != nil && len(h) > 0 {
			mc = rb.Cursor()
			mark, _ = mc.Seek(h[0].k[:])
		}
		for len(h) > 0 {
			e := h.pop()
			for mark != nil && bytes.Compare(mark, e.k[:]) < 0 {
				mark, _ = mc.Next()
			}
			if mark != nil && bytes.Equal(mark, e.k[:]) {
				continue // released
			}
			if err := fn(e.k[:], e.v); err != nil {
				return err
			}
		}
	}
	return nil
}

// slotHeap is a min-heap of slot entries by key (no boxing, unlike
// container/heap).
type slotHeap []slotEntry

func (h slotHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *slotHeap) pop() slotEntry {
	old := *h
	e := old[0]
	n := len(old) - 1
	old[0] = old[n]
	*h = old[:n]
	h.down(0)
	return e
}

func (h slotHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && store.CompareKeys(h[r].k, h[l].k) < 0 {
			m = r
		}
		if store.CompareKeys(h[m].k, h[i].k) >= 0 {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
