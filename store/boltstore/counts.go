package boltstore

import (
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// countsScanBudget bounds the messages Counts visits to find each
// exchange's earliest due.
const countsScanBudget = 1 << 20

// Pending is the number of pending (not stale) messages, in O(1).
func (s *Store) Pending() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.live + s.ov.live()
}

// Count is the number of pending messages of one exchange, in O(1).
func (s *Store) Count(vhost, exchange string) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{vhost, exchange}]
	if !ok {
		return 0
	}
	return s.counts[d.Incarnation] + s.ov.count(d.Incarnation)
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
		out = append(out, store.ExchangeCount{VHost: d.VHost, Exchange: d.Name, Pending: s.counts[d.Incarnation] + s.ov.count(d.Incarnation)})
	}
	incs := s.liveIncs() // never changed: safe to range after RUnlock
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
	if len(want) == 0 || s.settle() != nil {
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
