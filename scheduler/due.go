package scheduler

import (
	"math"
	"math/bits"
	"slices"

	"github.com/delayproxy/delayproxy/store"
)

// dueSet holds a wheel's entries due at or before its position, so that
// those due by now come out in release order among due entries: priority
// descending, then due time, then sequence (releaseOrder). It is one queue
// per priority, each in key order (due, then sequence), and a bitmap of the
// queues that hold entries: taking the next entry is a find-first-set and a
// queue's head; adding one in key order, as the loader and the slots do, is
// an append.
//
// Entries reach it only when the wheel is behind (ExpireN met more due
// entries than it may return) or are added already due, so a wheel that
// keeps up leaves it empty and pays nothing for it.
type dueSet struct {
	q   [256]dueQueue // q[255-priority]: the highest priority first
	occ [4]uint64     // bit i set when q[i] holds an entry
	n   int           // entries held
}

// dueQueue is one priority's entries, sorted by key. A cancelled entry stays
// in place, marked, until an end of the queue reaches it or the queue is
// compacted, so that a cancel never shifts the queue. The first and the last
// entry are never cancelled ones.
type dueQueue struct {
	e    []dueEntry // the queue is e[head:]; e[:head] is free room
	head int
	live int // entries in e[head:] not cancelled
}

type dueEntry struct {
	k    store.Key
	gone bool // cancelled
}

// releaseOrder is the order due keys are released in: priority descending,
// then due time, then sequence.
func releaseOrder(a, b store.Key) int {
	if pa, pb := a.Priority(), b.Priority(); pa != pb {
		return int(pb) - int(pa)
	}
	return store.CompareKeys(a, b)
}

func queueOf(k store.Key) int { return 255 - int(k.Priority()) }

// add inserts k and reports false when it is held already.
func (d *dueSet) add(k store.Key) bool {
	i := queueOf(k)
	if !d.q[i].add(k) {
		return false
	}
	d.occ[i>>6] |= 1 << (i & 63)
	d.n++
	return true
}

// cancel removes k and reports whether it was held.
func (d *dueSet) cancel(k store.Key) bool {
	i := queueOf(k)
	q := &d.q[i]
	if !q.cancel(k) {
		return false
	}
	d.n--
	if q.live == 0 {
		d.occ[i>>6] &^= 1 << (i & 63)
	}
	return true
}

// expire appends to dst at most limit entries due at or before now, in
// release order, and removes them.
func (d *dueSet) expire(now int64, dst []store.Key, limit int) []store.Key {
	for wi := range d.occ {
		for b := d.occ[wi]; b != 0 && limit > 0; b &= b - 1 {
			i := wi<<6 + bits.TrailingZeros64(b)
			q := &d.q[i]
			n := len(dst)
			dst = q.expire(now, dst, limit)
			limit -= len(dst) - n
			d.n -= len(dst) - n
			if q.live == 0 {
				d.occ[wi] &^= 1 << (i & 63)
			}
		}
	}
	return dst
}

// first is the earliest due time held; the set must not be empty.
func (d *dueSet) first() int64 {
	first := int64(math.MaxInt64)
	for wi, w := range d.occ {
		for ; w != 0; w &= w - 1 {
			q := &d.q[wi<<6+bits.TrailingZeros64(w)]
			first = min(first, q.e[q.head].k.Due())
		}
	}
	return first
}

// last is the greatest key held, in key order; the set must not be empty.
func (d *dueSet) last() store.Key {
	var last store.Key
	found := false
	for wi, w := range d.occ {
		for ; w != 0; w &= w - 1 {
			q := &d.q[wi<<6+bits.TrailingZeros64(w)]
			if k := q.e[len(q.e)-1].k; !found || store.CompareKeys(k, last) > 0 {
				last, found = k, true
			}
		}
	}
	return last
}

func compareEntry(e dueEntry, k store.Key) int { return store.CompareKeys(e.k, k) }

func (q *dueQueue) add(k store.Key) bool {
	live := q.e[q.head:]
	if n := len(live); n == 0 || store.CompareKeys(live[n-1].k, k) < 0 {
		q.e = append(q.e, dueEntry{k: k})
		q.live++
		return true
	}
	j, found := slices.BinarySearchFunc(live, k, compareEntry)
	switch {
	case !found:
		q.insert(j, k)
	case live[j].gone:
		live[j].gone = false
	default:
		return false
	}
	q.live++
	return true
}

// insert puts k at position j of the queue, before its last entry, moving
// the shorter side: a key that goes back to the front (a retry) costs O(1)
// amortized.
func (q *dueQueue) insert(j int, k store.Key) {
	if j >= (len(q.e)-q.head)/2 {
		q.e = slices.Insert(q.e, q.head+j, dueEntry{k: k})
		return
	}
	if q.head == 0 {
		// Room in front as large as the queue, so that a run of keys
		// going to the front moves the queue once.
		n := len(q.e)
		e := make([]dueEntry, 2*n, 2*n+cap(q.e)-n)
		copy(e[n:], q.e)
		q.e, q.head = e, n
	}
	copy(q.e[q.head-1:], q.e[q.head:q.head+j])
	q.head--
	q.e[q.head+j] = dueEntry{k: k}
}

func (q *dueQueue) cancel(k store.Key) bool {
	live := q.e[q.head:]
	j, found := slices.BinarySearchFunc(live, k, compareEntry)
	if !found || live[j].gone {
		return false
	}
	live[j].gone = true
	q.live--
	q.trim()
	return true
}

// expire appends to dst the queue's first entries due at or before now, at
// most limit of them, and removes them.
func (q *dueQueue) expire(now int64, dst []store.Key, limit int) []store.Key {
	for ; limit > 0 && q.live > 0; limit-- {
		k := q.e[q.head].k
		if k.Due() > now {
			break // the rest is due later still (the wall clock went back)
		}
		dst = append(dst, k)
		q.live--
		q.head++
		for q.live > 0 && q.e[q.head].gone {
			q.head++
		}
	}
	q.trim()
	return dst
}

// trim restores the queue's shape after entries left it: no cancelled
// entry at either end, nothing kept once the queue is empty, and no free
// room or cancelled entries much larger than what is live, so that a long
// backlog does not pin memory.
func (q *dueQueue) trim() {
	if q.live == 0 {
		if cap(q.e) > 4096 {
			q.e = nil
		} else {
			q.e = q.e[:0]
		}
		q.head = 0
		return
	}
	for q.e[q.head].gone {
		q.head++
	}
	n := len(q.e)
	for q.e[n-1].gone {
		n--
	}
	q.e = q.e[:n]
	switch dead := n - q.head - q.live; {
	case dead >= 64 && dead > q.live:
		w := 0
		for _, e := range q.e[q.head:] {
			if !e.gone {
				q.e[w] = e
				w++
			}
		}
		q.e, q.head = q.e[:w], 0
	case q.head >= 1024 && q.head > 2*(n-q.head):
		q.e, q.head = q.e[:copy(q.e, q.e[q.head:])], 0
	}
}
