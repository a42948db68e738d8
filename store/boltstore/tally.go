package boltstore

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// The tally counts stored messages (stale ones included) by due minute, for
// Upcoming. It is kept in memory and in meta's tally bucket, one row per
// hour that holds a stored message: hour index (due / 1h, 8 B BE) -> 60
// uvarint counts, one per minute. Every commit rewrites the rows of the
// hours it put into or removed from: messages published together with
// similar delays, and releases, touch one or two rows.
const (
	tallyMinute = 60_000           // ms: the tally's resolution
	tallyHour   = 60 * tallyMinute // ms: the span of one row
	tallyRowLen = tallyHour / tallyMinute
)

// tallyRow counts the stored messages due in each minute of one hour.
type tallyRow [tallyRowLen]int64

// Upcoming implements store.Store from the in-memory tally and the
// journaled messages: its cost is the number of hours that hold a stored
// message, times 60, plus the messages journaled since the last
// checkpoint.
func (s *Store) Upcoming(bounds []int64) []int64 {
	out := make([]int64, len(bounds)+1)
	// count adds n messages due in the minute starting at due to its
	// range: after every bound at or before it.
	count := func(due, n int64) {
		out[sort.Search(len(bounds), func(i int) bool { return bounds[i] > due })] += n
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for hour, row := range s.tally {
		for m, n := range row {
			if n != 0 {
				count(hour*tallyHour+int64(m)*tallyMinute, n)
			}
		}
	}
	for p := range s.ov.items() {
		count(p.key.Due()/tallyMinute*tallyMinute, 1)
	}
	return out
}

// addTally adds n messages due at due to the batch's tally changes.
func (b *batch) addTally(due, n int64) { b.tally[due/tallyMinute] += n }

// writeTally rewrites the rows of the hours whose counts the batch changed,
// and returns the new rows (nil: the row is gone) for applyCommitted.
func (b *batch) writeTally() (map[int64]*tallyRow, error) {
	if len(b.tally) == 0 {
		return nil, nil
	}
	rows := map[int64]*tallyRow{}
	for minute, d := range b.tally {
		if d == 0 {
			continue
		}
		hour := minute / tallyRowLen
		row := rows[hour]
		if row == nil {
			row = new(tallyRow)
			if old := b.s.tally[hour]; old != nil {
				*row = *old
			}
			rows[hour] = row
		}
		row[minute%tallyRowLen] += d
	}
	for hour, row := range rows {
		key := u64(uint64(hour))
		var err error
		switch {
		case slices.ContainsFunc(row[:], func(n int64) bool { return n < 0 }):
			err = fmt.Errorf("store: internal: tally of hour %d would be negative", hour)
		case *row == tallyRow{}:
			rows[hour] = nil
			err = b.tallyBk.Delete(key)
		default:
			err = b.tallyBk.Put(key, row.encode())
		}
		if err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// encode is the stored form of a row: 60 uvarints.
func (r *tallyRow) encode() []byte {
	b := make([]byte, 0, tallyRowLen+8)
	for _, n := range r {
		b = binary.AppendUvarint(b, uint64(n))
	}
	return b
}

// decodeTallyRow parses a stored row.
func decodeTallyRow(v []byte) (*tallyRow, error) {
	var r tallyRow
	for i := range r {
		n, l := binary.Uvarint(v)
		if l <= 0 || n > 1<<62 {
			return nil, fmt.Errorf("%w: tally row", errCorrupt)
		}
		r[i], v = int64(n), v[l:]
	}
	if len(v) != 0 {
		return nil, fmt.Errorf("%w: tally row of %d extra bytes", errCorrupt, len(v))
	}
	return &r, nil
}

// loadTally reads the tally bucket into memory.
func loadTally(bk *bolt.Bucket) (map[int64]*tallyRow, error) {
	out := map[int64]*tallyRow{}
	err := bk.ForEach(func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("%w: tally key %x", errCorrupt, k)
		}
		r, err := decodeTallyRow(v)
		if err != nil {
			return err
		}
		out[int64(beUint64(k))] = r
		return nil
	})
	return out, err
}

// countDue counts one message due at due into rows.
func countDue(rows map[int64]*tallyRow, due int64) {
	hour := due / tallyHour
	r := rows[hour]
	if r == nil {
		r = new(tallyRow)
		rows[hour] = r
	}
	r[due%tallyHour/tallyMinute]++
}

// countTally builds the tally of what tx stores: every unreleased message
// in a slot, every message at or after the watermark in a far bucket. It
// reads every key of the file, once, at the upgrade to schema 3.
func (s *Store) countTally(tx *bolt.Tx) map[int64]*tallyRow {
	out := map[int64]*tallyRow{}
	add := func(due int64) { countDue(out, due) }
	w := readWatermark(tx)
	slots, released := tx.Bucket(bucketSlots), tx.Bucket(bucketReleased)
	_ = slots.ForEachBucket(func(sk []byte) error {
		var rb *bolt.Bucket
		if released != nil {
			rb = released.Bucket(sk)
		}
		c := slots.Bucket(sk).Cursor()
		for f, _ := c.First(); f != nil; f, _ = c.Next() {
			if len(f) != store.KeySize {
				continue
			}
			if k := keyFromStored(f); rb == nil || rb.Get(k[:]) == nil {
				add(k.Due())
			}
		}
		return nil
	})
	far := tx.Bucket(bucketFar)
	_ = far.ForEachBucket(func(fk []byte) error {
		c := far.Bucket(fk).Cursor()
		for f, _ := c.First(); f != nil; f, _ = c.Next() {
			if len(f) == store.KeySize && storedDue(f) >= w {
				add(storedDue(f))
			}
		}
		return nil
	})
	return out
}
