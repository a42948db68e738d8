package scheduler

import (
	"math"
	"math/bits"
	"slices"

	"github.com/delayproxy/delayproxy/store"
)

const (
	minSpan      = 128  // smallest number of slots
	bucketShift  = 6    // a bucket is 64 one-ms slots: one word of occ
	stagePool    = 4    // drained stage arrays kept for the next buckets
	stagePoolCap = 4096 // largest stage array kept there
	freeMax      = 1024
	freeMaxCap   = 64 // emptied slot arrays up to this capacity are reused, freeMax of them
	slotCap      = 8  // capacity of a new slot array
)

// Wheel is a hashed timing wheel of store keys with one slot per millisecond.
// It is a plain data structure: no goroutines, no locks, the time is passed
// in (unix milliseconds).
//
// Expire returns the entries due by the time it is given in release order:
// priority descending, then due time, then sequence. Called every
// millisecond, it returns each entry at its due millisecond; called late, or
// with a limit below what is due, it returns the highest priority first
// across everything due. Add of a key already held is a no-op that reports
// false.
//
// Layout: Span() slots (a power of two, at least the horizon plus 64) and
// one level of 64 ms buckets in front of them:
//
//	due <= Now()               due: one queue per priority (dueSet)
//	Now() < due < open         slots[due & (Span-1)]: sorted slice of keys
//	open <= due <= Horizon()   stage[(due>>6) & (Span/64-1)]: unsorted keys
//	due > Horizon()            refused by Add (the caller keeps it on disk)
//
//	occ:  1 bit per slot, set when the slot is not empty (Span/64 words;
//	      word b covers the 64 slots of bucket b)
//	sum:  1 bit per occ word, set when that word is not zero
//	socc: 1 bit per bucket, set when its stage is not empty
//
// Within the horizon every slot and every bucket stands for exactly one time
// (Horizon stops one bucket short of wrapping onto the current one), so no
// entry carries a round count. Add appends a key due at or beyond open to
// the stage of its bucket; when Expire or Next reaches the first staged
// bucket, its keys are sorted into their slots and open moves to the
// bucket's end. Keys due before open go straight into their slot. This is a
// hierarchical wheel's cascade with one level and a 64 ms bucket; the
// horizon is short and the store holds everything later, so no second level
// is needed.
//
// Expire takes whole slots in key order, which within one millisecond is
// release order; only when what it returns spans several milliseconds does
// it sort them. Only when more is due than it may return (the caller is
// behind) does it move everything due into due, each key once, and return
// from there: the first set bit of a 256-bit map, then that priority's
// queue head.
//
// Costs: Add and Cancel O(1), plus a binary search within a slot or a due
// queue, or a scan of one bucket, when a key arrives out of order (proving
// a key new is O(1) when it is later than, or has a newer sequence than,
// everything in its bucket or queue: keys loaded in order, keys just
// published); Expire O(entries returned + Span/4096), plus one move per due
// entry when behind; Next O(Span/4096), or O(priorities due) when behind, so
// a driver arms one timer to exactly the next due time and never ticks
// through empty milliseconds. Expire never returns an entry due after the
// time it is given, and Now() never moves back: if the wall clock goes
// back, keys due between the new time and Now() wait in due until the clock
// reaches them.
type Wheel struct {
	pos   int64         // every entry due <= pos is in due
	span  int64         // number of 1 ms slots, a power of two
	mask  int64         // span - 1
	nb    int64         // number of buckets, span/64
	slots [][]store.Key // slots[due&mask]: the entries due exactly then, sorted
	occ   []uint64      // bit i set when slots[i] is not empty; word b is bucket b
	sum   []uint64      // bit j set when occ[j] != 0
	inSl  int           // entries in slots
	free  [][]store.Key // emptied slot arrays kept for reuse

	// Entries due in (pos, open) are in slots; those due in
	// [open, Horizon()] are staged, unsorted, in the bucket of their due
	// time until the wheel reaches that bucket.
	open   int64
	stage  []bucket      // stage[(due>>6) & (nb-1)]
	socc   []uint64      // bit b set when stage[b] is not empty
	staged int           // entries staged
	spool  [][]store.Key // drained stage arrays for reuse

	due dueSet // entries due <= pos
}

// bucket holds the staged entries of 64 milliseconds.
type bucket struct {
	keys   []store.Key // unsorted
	maxKey store.Key   // no key in keys is greater (an upper bound after Cancel)
	maxSeq uint64      // no key in keys has a greater sequence (likewise)
}

// NewWheel returns an empty wheel positioned at now (unix ms) that accepts
// keys due at least span milliseconds after its position (Horizon).
func NewWheel(now, span int64) *Wheel {
	n := int64(minSpan)
	for n < span+1<<bucketShift {
		n <<= 1
	}
	nb := n >> bucketShift
	return &Wheel{
		pos:   now,
		span:  n,
		mask:  n - 1,
		nb:    nb,
		slots: make([][]store.Key, n),
		occ:   make([]uint64, nb),
		sum:   make([]uint64, (nb+63)/64),
		open:  now + 1,
		stage: make([]bucket, nb),
		socc:  make([]uint64, (nb+63)/64),
	}
}

// Len is the number of entries held.
func (w *Wheel) Len() int { return w.inSl + w.staged + w.due.n }

// Now is the wheel's position: everything due at or before it that Expire
// was allowed to return has been returned. It never moves backwards.
func (w *Wheel) Now() int64 { return w.pos }

// Span is the number of one-millisecond slots, a power of two.
func (w *Wheel) Span() int64 { return w.span }

// Horizon is the latest due time Add accepts, between Now()+Span()-64 and
// Now()+Span()-1: the end of the last 64 ms bucket that does not share its
// slots with the bucket of Now()+1.
func (w *Wheel) Horizon() int64 { return ((w.pos+1)>>bucketShift+w.nb)<<bucketShift - 1 }

// Add inserts k. It reports false, and holds nothing new, when k is already
// held or is due after Horizon(). Keys due at or before Now() are accepted
// and returned by the next Expire. Add is O(1) (an append) for a key later
// than those its bucket holds or newer than them (the common cases: keys
// loaded in order, keys just published); otherwise it looks for the key in
// its slot (binary search) or bucket (linear).
func (w *Wheel) Add(k store.Key) bool {
	d := k.Due()
	switch {
	case d <= w.pos:
		return w.due.add(k)
	case d > w.Horizon():
		return false
	case d < w.open:
		return w.addSlot(d, k)
	}
	b := &w.stage[(d>>bucketShift)&(w.nb-1)]
	if len(b.keys) == 0 {
		if n := len(w.spool); cap(b.keys) == 0 && n > 0 {
			b.keys, w.spool = w.spool[n-1], w.spool[:n-1]
		}
		i := (d >> bucketShift) & (w.nb - 1)
		w.socc[i>>6] |= 1 << (i & 63)
		b.maxKey, b.maxSeq = k, k.Seq()
	} else {
		if store.CompareKeys(k, b.maxKey) <= 0 && k.Seq() <= b.maxSeq && slices.Contains(b.keys, k) {
			return false
		}
		if store.CompareKeys(k, b.maxKey) > 0 {
			b.maxKey = k
		}
		b.maxSeq = max(b.maxSeq, k.Seq())
	}
	b.keys = append(b.keys, k)
	w.staged++
	return true
}

func (w *Wheel) addSlot(d int64, k store.Key) bool {
	i := d & w.mask
	s := w.slots[i]
	if s == nil {
		if n := len(w.free); n > 0 {
			s, w.free = w.free[n-1], w.free[:n-1]
		} else {
			s = make([]store.Key, 0, slotCap)
		}
	}
	s, ok := insertKey(s, k)
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
	switch {
	case d <= w.pos:
		return w.due.cancel(k)
	case d > w.Horizon():
		return false
	case d < w.open:
		i := d & w.mask
		s := w.slots[i]
		j, found := slices.BinarySearchFunc(s, k, store.CompareKeys)
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
	i := (d >> bucketShift) & (w.nb - 1)
	b := &w.stage[i]
	j := slices.Index(b.keys, k)
	if j < 0 {
		return false
	}
	last := len(b.keys) - 1
	b.keys[j] = b.keys[last]
	b.keys = b.keys[:last]
	w.staged--
	if last == 0 {
		w.socc[i>>6] &^= 1 << (i & 63)
	}
	return true
}

// Next is the earliest due time held, and false when the wheel is empty.
// It finds the first non-empty slot with two bitmap levels, sorting the
// first staged bucket into its slots if no slot is occupied, so a driver
// can sleep until exactly then.
func (w *Wheel) Next() (int64, bool) {
	if w.due.n > 0 {
		return w.due.first(), true // due entries are earlier than the rest
	}
	if w.inSl == 0 {
		if w.staged == 0 {
			return 0, false
		}
		w.openBucket(w.firstStaged())
	}
	return w.nextSlot(), true
}

// Last is the latest key held, and false when the wheel is empty. A driver
// that bounds the wheel's size evicts it with Cancel.
func (w *Wheel) Last() (store.Key, bool) {
	if w.staged > 0 {
		b := w.stage[w.lastStaged()&(w.nb-1)]
		last := b.keys[0]
		for _, k := range b.keys[1:] {
			if store.CompareKeys(k, last) > 0 {
				last = k
			}
		}
		return last, true
	}
	if w.inSl > 0 {
		s := w.slots[w.lastSlot()&w.mask]
		return s[len(s)-1], true
	}
	if w.due.n > 0 {
		return w.due.last(), true
	}
	return store.Key{}, false
}

// Expire appends to dst every entry due at or before now, in release order
// (priority descending, then due time, then sequence), and removes them from
// the wheel. It never returns an entry due after now.
func (w *Wheel) Expire(now int64, dst []store.Key) []store.Key {
	return w.ExpireN(now, dst, math.MaxInt)
}

// ExpireN is Expire returning at most limit entries: the first limit, in
// release order, of those due at or before now; the rest stay in the wheel
// and come first next time. The work is proportional to the entries
// returned and the staged entries sorted into slots on the way, plus
// Span()/4096 words of bitmap per call; when more is due than limit, each
// due entry is also moved once into the due queues.
func (w *Wheel) ExpireN(now int64, dst []store.Key, limit int) []store.Key {
	if limit <= 0 {
		return dst
	}
	if w.due.n == 0 {
		// Keeping up: what is due fits in limit, and is mostly one
		// millisecond, whose slot is in release order already.
		start := len(dst)
		var all bool
		if dst, all = w.expireSlots(now, dst, limit); all {
			if got := dst[start:]; len(got) > 1 && got[0].Due() != got[len(got)-1].Due() {
				slices.SortFunc(got, releaseOrder)
			}
			return dst
		}
		// Behind: more is due than limit. The best of everything due
		// goes first, so all of it goes into the due queues.
		for _, k := range dst[start:] {
			w.due.add(k)
		}
		dst = dst[:start]
	}
	w.spillDue(now)
	return w.due.expire(now, dst, limit)
}

// expireSlots appends to dst, in key order, whole slots of entries due at
// or before now while they fit in limit. It reports whether it took every
// entry due; if not, the position is the due time of the last slot taken.
func (w *Wheel) expireSlots(now int64, dst []store.Key, limit int) ([]store.Key, bool) {
	for {
		d, ok := w.nextDueSlot(now)
		if !ok {
			return dst, true
		}
		i := d & w.mask
		s := w.slots[i]
		if len(s) > limit {
			return dst, false
		}
		dst = append(dst, s...)
		limit -= len(s)
		w.inSl -= len(s)
		w.clearSlot(i)
		w.pos = d
	}
}

// spillDue moves every entry due at or before now from the slots into the
// due queues. Slots are later than every due entry and taken in key order,
// so each key is appended to its queue.
func (w *Wheel) spillDue(now int64) {
	for {
		d, ok := w.nextDueSlot(now)
		if !ok {
			return
		}
		i := d & w.mask
		for _, k := range w.slots[i] {
			w.due.add(k)
		}
		w.inSl -= len(w.slots[i])
		w.clearSlot(i)
		w.pos = d
	}
}

// nextDueSlot is the due time of the first non-empty slot when it is due at
// or before now, sorting staged buckets into slots on the way. When nothing
// in the slots is due, it moves the position up to now and reports false.
func (w *Wheel) nextDueSlot(now int64) (int64, bool) {
	for {
		if w.inSl > 0 {
			if d := w.nextSlot(); d <= now {
				return d, true
			}
		} else if w.staged > 0 {
			// Staged entries are later than every slot entry.
			if b := w.firstStaged(); b<<bucketShift <= now {
				w.openBucket(b)
				continue
			}
		}
		w.pos = max(w.pos, now)
		w.open = max(w.open, w.pos+1)
		return 0, false
	}
}

// openBucket sorts the staged entries of bucket b (an absolute bucket
// number, the first one holding staged entries) into their slots.
func (w *Wheel) openBucket(b int64) {
	i := b & (w.nb - 1)
	st := &w.stage[i]
	for _, k := range st.keys {
		w.addSlot(k.Due(), k)
	}
	w.staged -= len(st.keys)
	// The array goes to the bucket that starts filling next, not back to
	// this one, which fills again only a span later.
	if cap(st.keys) <= stagePoolCap && len(w.spool) < stagePool {
		w.spool = append(w.spool, st.keys[:0])
	}
	*st = bucket{}
	w.socc[i>>6] &^= 1 << (i & 63)
	w.open = (b + 1) << bucketShift
}

// firstStaged is the absolute number of the first bucket with staged
// entries; there must be one.
func (w *Wheel) firstStaged() int64 {
	s := w.open >> bucketShift
	idx := s & (w.nb - 1)
	if r := firstSetIn(w.socc, idx); r >= 0 {
		return s + r - idx
	}
	return s + w.nb - idx + firstSetIn(w.socc, 0)
}

// lastStaged is the absolute number of the last bucket with staged entries;
// there must be one.
func (w *Wheel) lastStaged() int64 {
	e := w.Horizon() >> bucketShift
	idx := e & (w.nb - 1)
	if r := lastSetIn(w.socc, idx); r >= 0 {
		return e - (idx - r)
	}
	return e - idx - (w.nb - lastSetIn(w.socc, w.nb-1))
}

// firstSetIn is the first index >= i whose bit is set in bits, or -1.
func firstSetIn(set []uint64, i int64) int64 {
	wi := i >> 6
	if wi >= int64(len(set)) {
		return -1
	}
	b := set[wi] &^ (1<<(i&63) - 1)
	for {
		if b != 0 {
			return wi<<6 + int64(bits.TrailingZeros64(b))
		}
		wi++
		if wi >= int64(len(set)) {
			return -1
		}
		b = set[wi]
	}
}

// lastSetIn is the last index <= i whose bit is set in bits, or -1.
func lastSetIn(set []uint64, i int64) int64 {
	wi := i >> 6
	b := set[wi] & (2<<(i&63) - 1)
	for {
		if b != 0 {
			return wi<<6 + 63 - int64(bits.LeadingZeros64(b))
		}
		if wi == 0 {
			return -1
		}
		wi--
		b = set[wi]
	}
}

// clearSlot empties slot i and clears its occupancy bits.
func (w *Wheel) clearSlot(i int64) {
	if s := w.slots[i]; cap(s) <= freeMaxCap && len(w.free) < freeMax {
		w.free = append(w.free, s[:0])
	}
	w.slots[i] = nil
	w.occ[i>>6] &^= 1 << (i & 63)
	if w.occ[i>>6] == 0 {
		w.sum[i>>12] &^= 1 << ((i >> 6) & 63)
	}
}

// nextSlot is the due time of the first non-empty slot after pos; there must
// be one (inSl > 0).
func (w *Wheel) nextSlot() int64 {
	d, _ := w.slotFrom(w.pos + 1)
	return d
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
	if n := len(s); n == 0 || store.CompareKeys(s[n-1], k) < 0 {
		return append(s, k), true
	}
	j, found := slices.BinarySearchFunc(s, k, store.CompareKeys)
	if found {
		return s, false
	}
	return slices.Insert(s, j, k), true
}
