package boltstore

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/delayproxy/delayproxy/store"
	bolt "go.etcd.io/bbolt"
)

const (
	// countsScanBudget bounds the messages Counts visits to find each
	// exchange's earliest due.
	countsScanBudget = 1 << 20
	// defaultListLimit and maxListLimit bound a List page.
	defaultListLimit = 100
	maxListLimit     = 10000
)

// Get reads messages by key in one read transaction. The result has one
// entry per key, nil for a key that is not stored.
func (s *Store) Get(keys []store.Key) ([]*store.Message, error) {
	out := make([]*store.Message, len(keys))
	err := s.view(func(tx *bolt.Tx) error {
		w := readWatermark(tx)
		for i, k := range keys {
			v := s.lookup(tx, w, k)
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

// Scan calls fn for every stored message due in [from, until), in release
// order (key order), stale ones included. It stops at the first error fn
// returns and returns it, except ErrStop, which ends the scan with nil.
//
// Scan first moves the cascade watermark past until (a write that sorts far
// buckets into slots), so call it for the scheduler's horizon, not for
// far-future ranges; List serves the admin API without moving anything. fn
// runs inside a read transaction: it must not wait for a Put, Delete or
// other write of this store.
func (s *Store) Scan(from, until int64, fn func(*store.Message) error) error {
	return s.scanRange(from, until, func(k, v []byte) error {
		m, err := decodeMessage(store.Key(k), v, true)
		if err != nil {
			return fmt.Errorf("key %x: %w", k, err)
		}
		return fn(m)
	})
}

// ScanKeys is Scan without decoding values: the cheap way to load the wheel.
func (s *Store) ScanKeys(from, until int64, fn func(store.Key) error) error {
	return s.scanRange(from, until, func(k, _ []byte) error { return fn(store.Key(k)) })
}

func (s *Store) scanRange(from, until int64, fn func(k, v []byte) error) error {
	from = max(from, 0)
	until = min(until, maxDue)
	if until <= from {
		return nil
	}
	if err := s.cascadeTo(until); err != nil {
		return err
	}
	return s.view(func(tx *bolt.Tx) error {
		err := s.scanSlots(tx, from, until, fn)
		if errors.Is(err, store.ErrStop) {
			return nil
		}
		return err
	})
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

// NextDue is the earliest due time of any stored message (stale ones
// included). Usually it reads the first slot (one slot width of
// messages); when every message lies beyond the watermark it asks the
// writer, which keeps the earliest far due cached (a scan of one far bucket
// when the cache was invalidated). false when nothing is stored or the
// store is closed.
func (s *Store) NextDue() (int64, bool) {
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

// Counts lists the pending count of every registered exchange, sorted by
// vhost and name. Pending is exact and O(1) per exchange. NextDue comes from
// one read scan in release order that stops once every exchange with
// pending messages has been seen, or after visiting countsScanBudget (1M)
// messages, whichever is first: exchanges not reached keep NextDue 0. The
// scan's cost grows with the number of messages due before the last
// exchange's earliest one.
func (s *Store) Counts() []store.ExchangeCount {
	s.mu.RLock()
	out := make([]store.ExchangeCount, 0, len(s.exchanges))
	for _, d := range s.exchanges {
		out = append(out, store.ExchangeCount{VHost: d.VHost, Exchange: d.Name, Pending: s.counts[d.Incarnation]})
	}
	incs := make(map[uint64]exKey, len(s.liveInc))
	for inc, k := range s.liveInc {
		incs[inc] = k
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b store.ExchangeCount) int {
		if c := strings.Compare(a.VHost, b.VHost); c != 0 {
			return c
		}
		return strings.Compare(a.Exchange, b.Exchange)
	})
	want := make(map[uint64]int)
	for inc, k := range incs {
		i, _ := slices.BinarySearchFunc(out, k, func(c store.ExchangeCount, k exKey) int {
			if x := strings.Compare(c.VHost, k.vhost); x != 0 {
				return x
			}
			return strings.Compare(c.Exchange, k.name)
		})
		if out[i].Pending > 0 {
			want[inc] = i
		}
	}
	if len(want) == 0 {
		return out
	}
	_ = s.view(func(tx *bolt.Tx) error {
		budget := countsScanBudget
		w := readWatermark(tx)
		_ = s.scanSlots(tx, 0, w, func(k, v []byte) error {
			if i, ok := want[peekIncarnation(v)]; ok {
				out[i].NextDue = store.Key(k).Due()
				delete(want, peekIncarnation(v))
			}
			if budget--; budget <= 0 || len(want) == 0 {
				return store.ErrStop
			}
			return nil
		})
		far := tx.Bucket(bucketFar)
		c := far.Cursor()
		for fk, _ := c.Seek(s.farBucketKey(w)); fk != nil && len(want) > 0 && budget > 0; fk, _ = c.Next() {
			found := map[uint64]int64{}
			bc := far.Bucket(fk).Cursor()
			for k, v := bc.First(); k != nil; k, v = bc.Next() {
				budget--
				due := storedDue(k)
				if due < w {
					continue
				}
				inc := peekIncarnation(v)
				if _, ok := want[inc]; ok {
					if d, seen := found[inc]; !seen || due < d {
						found[inc] = due
					}
				}
			}
			for inc, due := range found {
				out[want[inc]].NextDue = due
				delete(want, inc)
			}
		}
		return nil
	})
	return out
}

// List returns up to limit pending messages of one exchange whose key is
// after `after` (the zero Key starts at the beginning), in release order,
// for paging in the admin API. limit <= 0 means 100; at most 10000. Without
// withBody the messages come without Body.
//
// Cost: messages before the watermark are walked in key order and filtered,
// so a page costs the number of messages (of any exchange) between after
// and the last one returned; beyond the watermark each far bucket reached is
// scanned whole, keeping only the next limit keys in a heap.
func (s *Store) List(vhost, exchange string, after store.Key, limit int, withBody bool) ([]*store.Message, error) {
	d, ok := s.Exchange(vhost, exchange)
	if !ok {
		return nil, fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, exchange, vhost)
	}
	if limit <= 0 {
		limit = defaultListLimit
	}
	limit = min(limit, maxListLimit)
	inc := u64(d.Incarnation)
	match := func(k, v []byte) bool {
		return len(v) >= msgHeaderSize && bytes.Equal(v[2:10], inc) && bytes.Compare(k, after[:]) > 0
	}
	var out []*store.Message
	err := s.view(func(tx *bolt.Tx) error {
		w := readWatermark(tx)
		from := after.Due()
		err := s.scanSlots(tx, from, w, func(k, v []byte) error {
			if !match(k, v) {
				return nil
			}
			m, err := decodeMessage(store.Key(k), v, withBody)
			if err != nil {
				return err
			}
			if out = append(out, m); len(out) == limit {
				return store.ErrStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, store.ErrStop) {
			return err
		}
		far := tx.Bucket(bucketFar)
		c := far.Cursor()
		for fk, _ := c.Seek(s.farBucketKey(max(from, w))); fk != nil && len(out) < limit; fk, _ = c.Next() {
			need := limit - len(out)
			fb := far.Bucket(fk)
			h := &keyHeap{}
			bc := fb.Cursor()
			for fkey, v := bc.First(); fkey != nil; fkey, v = bc.Next() {
				if storedDue(fkey) < w {
					continue
				}
				k := keyFromStored(fkey)
				if !match(k[:], v) || (h.Len() == need && store.CompareKeys(k, (*h)[0]) > 0) {
					continue
				}
				heap.Push(h, k)
				if h.Len() > need {
					heap.Pop(h)
				}
			}
			keys := []store.Key(*h)
			slices.SortFunc(keys, store.CompareKeys)
			for _, k := range keys {
				m, err := decodeMessage(k, fb.Get(storedKey(k)), withBody)
				if err != nil {
					return err
				}
				out = append(out, m)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
