package scheduler

import "github.com/delayproxy/delayproxy/store"

// Looking ahead in the wheel without expiring anything: the read-ahead
// (readahead.go) asks which keys fall due soon, so their messages are read
// from the store before they are due. Both methods sort the staged buckets
// they reach into their slots, as Next does; that changes where keys wait,
// never what Expire returns.

// Peek appends to dst, in key order, the keys due in (after, until] that
// wait in the slots or stages, and leaves them in the wheel. Keys already
// due (at or before Now()) are not among them.
func (w *Wheel) Peek(after, until int64, dst []store.Key) []store.Key {
	after = max(after, w.pos)
	until = min(until, w.Horizon())
	for w.staged > 0 {
		b := w.firstStaged()
		if b<<bucketShift > until {
			break
		}
		w.openBucket(b)
	}
	for d := after + 1; d <= until; d++ {
		next, ok := w.slotFrom(d)
		if !ok || next > until {
			break
		}
		dst = append(dst, w.slots[next&w.mask]...)
		d = next
	}
	return dst
}

// NextAfter is the earliest due time after t held in the slots or stages,
// and false when there is none. Keys already due (at or before Now()) are
// not considered.
func (w *Wheel) NextAfter(t int64) (int64, bool) {
	t = max(t, w.pos)
	for {
		if t+1 < w.open {
			if d, ok := w.slotFrom(t + 1); ok {
				return d, true
			}
		}
		if w.staged == 0 {
			return 0, false
		}
		w.openBucket(w.firstStaged())
	}
}

// slotFrom is the due time of the first non-empty slot due at or after d,
// for d in (Now(), Now()+Span()]. Slots hold due times in (Now(), open):
// an index found past open's is a slot due before d, wrapped around.
func (w *Wheel) slotFrom(d int64) (int64, bool) {
	if w.inSl == 0 {
		return 0, false
	}
	start := d & w.mask
	r := w.firstSet(start)
	due := d + (r - start)
	if r < 0 {
		if r = w.firstSet(0); r < 0 {
			return 0, false
		}
		due = d + (w.span - start) + r
	}
	if due >= w.open {
		return 0, false
	}
	return due, true
}
