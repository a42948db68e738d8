package scheduler

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"

	"github.com/delayproxy/delayproxy/store"
)

// minSpan is the smallest number of slots a Wheel has.
const minSpan = 64

// Wheel is a hashed timing wheel of store keys with one slot per millisecond.
// It is a plain data structure: no goroutines, no locks, the time is passed
// in. See the package doc for the layout.
//
// Entries are held in release order (store.Key byte order): Expire returns
// them by due time, then priority descending, then sequence.
type Wheel struct {
	pos   int64         // every entry due <= pos is in over; slots hold entries due in (pos, pos+span]
	span  int64         // number of 1 ms slots, a power of two
	mask  int64         // span - 1
	slots [][]store.Key // slots[due&mask]: the entries due exactly then, sorted
	occ   []uint64      // bit i set when slots[i] is not empty
	sum   []uint64      // bit j set when occ[j] != 0
	inSl  int           // entries in slots
	over  []store.Key   // entries due <= pos, sorted; the live ones are over[head:]
	head  int
}

// NewWheel returns an empty wheel positioned at now (unix ms) whose slots
// cover at least span milliseconds ahead of its position; span is rounded up
// to a power of two.
func NewWheel(now, span int64) *Wheel {
	n := int64(minSpan)
	for n < span {
		n <<= 1
	}
	words := n / 64
	return &Wheel{
		pos:   now,
		span:  n,
		mask:  n - 1,
		slots: make([][]store.Key, n),
		occ:   make([]uint64, words),
		sum:   make([]uint64, (words+63)/64),
	}
}

// Len is the number of entries held.
func (w *Wheel) Len() int { return w.inSl + len(w.over) - w.head }

// Now is the wheel's position: everything due at or before it that Expire
// was allowed to return has been returned. It never moves backwards.
func (w *Wheel) Now() int64 { return w.pos }

// Span is the number of milliseconds the slots cover ahead of Now.
func (w *Wheel) Span() int64 { return w.span }

// Horizon is the latest due time Add accepts: Now() + Span().
func (w *Wheel) Horizon() int64 { return w.pos + w.span }

// Add inserts k. It reports false, and holds nothing new, when k is already
// held or is due after Horizon(). Keys due at or before Now() are accepted
// and returned by the next Expire. Appending in key order is O(1); an
// out-of-order key costs a binary search and a move within its slot.
func (w *Wheel) Add(k store.Key) bool {
	d := k.Due()
	if d <= w.pos {
		live, ok := insertKey(w.over[w.head:], k)
		if !ok {
			return false
		}
		if len(live) > cap(w.over)-w.head {
			// insertKey reallocated: the dead prefix stays behind.
			w.over, w.head = live, 0
			return true
		}
		w.over = w.over[:w.head+len(live)]
		return true
	}
	if d-w.pos > w.span {
		return false
	}
	i := d & w.mask
	s, ok := insertKey(w.slots[i], k)
	if !ok {
		return false
	}
	if len(w.slots[i]) == 0 {
		w.occ[i>>6] |= 1 << (i & 63)
		w.sum[i>>12] |= 1 << ((i >> 6) & 63)
	}
	w.slots[i] = s
	w.inSl++
	return true
}

// Cancel removes k and reports whether it was held.
func (w *Wheel) Cancel(k store.Key) bool {
	d := k.Due()
	if d <= w.pos {
		live := w.over[w.head:]
		j, found := slices.BinarySearchFunc(live, k, compareKey)
		if !found {
			return false
		}
		if j == 0 {
			w.over[w.head] = store.Key{}
			w.head++
			w.compactOver()
			return true
		}
		live = slices.Delete(live, j, j+1)
		w.over = w.over[:w.head+len(live)]
		return true
	}
	if d-w.pos > w.span {
		return false
	}
	i := d & w.mask
	s := w.slots[i]
	j, found := slices.BinarySearchFunc(s, k, compareKey)
	if !found {
		return false
	}
	w.inSl--
	if len(s) == 1 {
		w.clearSlot(i)
		return true
	}
	w.slots[i] = slices.Delete(s, j, j+1)
	return true
}

// Next is the earliest due time held, and false when the wheel is empty.
// With no entries at or before Now() it finds the next non-empty slot with
// two bitmap levels, so a driver can sleep until then.
func (w *Wheel) Next() (int64, bool) {
	if w.head < len(w.over) {
		return w.over[w.head].Due(), true
	}
	if w.inSl == 0 {
		return 0, false
	}
	return w.nextSlot(), true
}

// Last is the latest key held, and false when the wheel is empty. A driver
// that bounds the wheel's size evicts it with Cancel.
func (w *Wheel) Last() (store.Key, bool) {
	if w.inSl > 0 {
		s := w.slots[w.lastSlot()&w.mask]
		return s[len(s)-1], true
	}
	if w.head < len(w.over) {
		return w.over[len(w.over)-1], true
	}
	return store.Key{}, false
}

// Expire appends to dst every entry due at or before now, in key order, and
// removes them from the wheel. It never returns an entry due after now.
func (w *Wheel) Expire(now int64, dst []store.Key) []store.Key {
	return w.ExpireN(now, dst, math.MaxInt)
}

// ExpireN is Expire returning at most max entries; the rest stay in the wheel
// and come first next time. The work is proportional to the entries returned
// plus Span()/4096 words of bitmap per call.
func (w *Wheel) ExpireN(now int64, dst []store.Key, max int) []store.Key {
	if max <= 0 {
		return dst
	}
	// Entries due at or before pos come first: every slot entry is later.
	live := w.over[w.head:]
	n := 0
	for n < len(live) && n < max && live[n].Due() <= now {
		n++
	}
	if n > 0 {
		dst = append(dst, live[:n]...)
		clear(live[:n])
		w.head += n
		max -= n
		w.compactOver()
	}
	if n < len(live) {
		// Stopped at max, or the rest is due after now (the wall clock
		// went back); slot entries are later still.
		return dst
	}
	for now > w.pos && max > 0 {
		if w.inSl == 0 {
			w.pos = now
			break
		}
		d := w.nextSlot()
		if d > now {
			w.pos = now
			break
		}
		i := d & w.mask
		s := w.slots[i]
		if len(s) > max {
			dst = append(dst, s[:max]...)
			w.slots[i] = s[max:]
			w.inSl -= max
			w.pos = d - 1
			return dst
		}
		dst = append(dst, s...)
		max -= len(s)
		w.inSl -= len(s)
		w.clearSlot(i)
		w.pos = d
	}
	return dst
}

// clearSlot empties slot i and clears its occupancy bits.
func (w *Wheel) clearSlot(i int64) {
	w.slots[i] = nil
	w.occ[i>>6] &^= 1 << (i & 63)
	if w.occ[i>>6] == 0 {
		w.sum[i>>12] &^= 1 << ((i >> 6) & 63)
	}
}

// compactOver releases the dead prefix of over once the live part is empty
// or small next to it, so a long backlog does not pin memory.
func (w *Wheel) compactOver() {
	live := len(w.over) - w.head
	switch {
	case live == 0:
		if cap(w.over) > 4096 {
			w.over = nil
		} else {
			w.over = w.over[:0]
		}
		w.head = 0
	case w.head >= 1024 && w.head >= live:
		n := copy(w.over, w.over[w.head:])
		clear(w.over[n:])
		w.over = w.over[:n]
		w.head = 0
	}
}

// nextSlot is the due time of the first non-empty slot after pos; there must
// be one (inSl > 0).
func (w *Wheel) nextSlot() int64 {
	start := (w.pos + 1) & w.mask
	if r := w.firstSet(start); r >= 0 {
		return w.pos + 1 + (r - start)
	}
	r := w.firstSet(0)
	return w.pos + 1 + (w.span - start) + r
}

// lastSlot is the due time of the last non-empty slot; there must be one.
func (w *Wheel) lastSlot() int64 {
	end := w.pos & w.mask // the slot of due pos+span
	if r := w.lastSet(end); r >= 0 {
		return w.pos + w.span - (end - r)
	}
	return w.pos + w.lastSet(w.span-1) - end
}

// lastSet is the last slot index <= i whose occupancy bit is set, or -1.
func (w *Wheel) lastSet(i int64) int64 {
	wi := i >> 6
	if b := w.occ[wi] & (2<<(i&63) - 1); b != 0 {
		return wi<<6 + 63 - int64(bits.LeadingZeros64(b))
	}
	if wi == 0 {
		return -1
	}
	wi--
	si := wi >> 6
	s := w.sum[si] & (2<<(wi&63) - 1)
	for {
		if s != 0 {
			oi := si<<6 + 63 - int64(bits.LeadingZeros64(s))
			return oi<<6 + 63 - int64(bits.LeadingZeros64(w.occ[oi]))
		}
		if si == 0 {
			return -1
		}
		si--
		s = w.sum[si]
	}
}

// firstSet is the first slot index >= i whose occupancy bit is set, or -1.
func (w *Wheel) firstSet(i int64) int64 {
	wi := i >> 6
	if b := w.occ[wi] &^ (1<<(i&63) - 1); b != 0 {
		return wi<<6 + int64(bits.TrailingZeros64(b))
	}
	wi++
	if wi >= int64(len(w.occ)) {
		return -1
	}
	si := wi >> 6
	s := w.sum[si] &^ (1<<(wi&63) - 1)
	for {
		if s != 0 {
			oi := si<<6 + int64(bits.TrailingZeros64(s))
			return oi<<6 + int64(bits.TrailingZeros64(w.occ[oi]))
		}
		si++
		if si >= int64(len(w.sum)) {
			return -1
		}
		s = w.sum[si]
	}
}

// insertKey inserts k into the sorted s, reporting false when it is there.
func insertKey(s []store.Key, k store.Key) ([]store.Key, bool) {
	if n := len(s); n == 0 || compareKey(s[n-1], k) < 0 {
		return append(s, k), true
	}
	j, found := slices.BinarySearchFunc(s, k, compareKey)
	if found {
		return s, false
	}
	return slices.Insert(s, j, k), true
}

// compareKey orders keys as bytes.Compare does, in three word compares.
func compareKey(a, b store.Key) int {
	if x, y := binary.BigEndian.Uint64(a[0:8]), binary.BigEndian.Uint64(b[0:8]); x != y {
		if x < y {
			return -1
		}
		return 1
	}
	if a[8] != b[8] {
		if a[8] < b[8] {
			return -1
		}
		return 1
	}
	x, y := binary.BigEndian.Uint64(a[9:17]), binary.BigEndian.Uint64(b[9:17])
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}
