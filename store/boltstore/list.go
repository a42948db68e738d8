package boltstore

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// defaultListLimit and maxListLimit bound a List page.
const (
	defaultListLimit = 100
	maxListLimit     = 10000
)

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
	if err := s.settle(); err != nil {
		return nil, err
	}
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
