package scheduler

import (
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The loader. A cursor key splits the stored messages: every key below it
// has been scanned into the wheel (or released since); keys at or above it
// are on disk, and may be in the wheel too (Add of a key held is a no-op).
// When less than half the horizon is loaded, the loader calls ScanKeys from
// the cursor to now+Horizon, at most loadChunk keys per loop turn and at
// most MaxLoaded keys in the wheel. When a key below the cursor must go into
// a full wheel, the wheel's latest key is evicted and the cursor moves back
// to it, so the wheel always holds the earliest keys.
//
// The first load starts the cursor at the store's NextDue, so everything
// overdue drains first. The store sorts far messages into slots for the
// range a scan asks for before answering, so behind a backlog the loader
// asks for windows that start at one horizon and double while it is still
// behind: the first release after a long downtime waits for the first
// window only (invariant 6).

const (
	loadChunk = 4096           // most keys one ScanKeys call loads
	maxWindow = int64(1) << 40 // ms, far beyond any backlog
)

// addKey puts a key below the cursor into the wheel unless it is already out
// for release; if that makes the wheel too big, the latest key goes back to
// being on disk only.
func (s *Scheduler) addKey(k store.Key) {
	if _, out := s.outstanding[k]; out {
		return
	}
	if !s.w.Add(k) || s.w.Len() <= s.opts.MaxLoaded {
		return
	}
	last, _ := s.w.Last()
	s.w.Cancel(last)
	if store.CompareKeys(last, s.cursor) < 0 {
		s.cursor = last
	}
}

// loadRange is what the loader would scan now: keys from the cursor due
// before until, at most limit of them. ok is false when there is nothing to
// do, and then wake is when there will be (zero: when something else
// changes).
func (s *Scheduler) loadRange(now time.Time) (from, until int64, limit int, wake time.Time, ok bool) {
	nowMs := now.UnixMilli()
	from = s.cursor.Due()
	if from > nowMs+s.hzMs/2 {
		// More than half the horizon is loaded.
		return 0, 0, 0, time.UnixMilli(from - s.hzMs/2), false
	}
	if now.Before(s.loadAfter) {
		return 0, 0, 0, s.loadAfter, false
	}
	limit = min(s.opts.MaxLoaded-s.w.Len(), loadChunk)
	end := from + s.window
	if from < s.windowEnd {
		end = s.windowEnd // the rest of a window scanned in chunks
	}
	until = min(nowMs+s.hzMs, s.w.Horizon()+1, end)
	if limit <= 0 || until <= from {
		return 0, 0, 0, time.Time{}, false // until release makes room
	}
	return from, until, limit, now, true
}

// load scans the store from the cursor up to now+Horizon into the wheel, at
// most loadChunk keys at a time. It reports whether more is ready to load.
func (s *Scheduler) load(now time.Time) bool {
	from, until, limit, _, ok := s.loadRange(now)
	if !ok {
		return false
	}
	if !s.jumped {
		// Skip the empty past: start at the first stored key. A key
		// stored before the bound is raised is seen by NextDue; one
		// stored later is queued by Added.
		s.jumped = true
		bound := now.UnixMilli() + s.hzMs
		s.raiseAddBound(bound)
		if first, ok := s.st.NextDue(); ok && first > from {
			// Not past the bound: a key due after it, stored from now
			// on, is left by Added to a scan.
			s.cursor = store.MakeKey(min(first, bound), 255, 0)
			if from, until, limit, _, ok = s.loadRange(now); !ok {
				return false
			}
		}
	}
	// Before the scan: a key Added from now on below until is queued, and
	// a key Added before this was stored before the scan began.
	s.raiseAddBound(until)
	n := 0
	var next store.Key
	stopped := false
	err := s.st.ScanKeys(from, until, func(k store.Key) error {
		if store.CompareKeys(k, s.cursor) < 0 {
			return nil // loaded before, in a millisecond split across chunks
		}
		if n == limit {
			next, stopped = k, true
			return store.ErrStop
		}
		n++
		s.addKey(k)
		return nil
	})
	if err != nil {
		s.storeError("load", err)
		return false
	}
	if stopped {
		s.cursor, s.windowEnd = next, until
		return true
	}
	s.cursor = store.MakeKey(until, 255, 0) // the first key due at until
	if until < now.UnixMilli()+s.hzMs {
		// Behind (a backlog): scan further next time. Small windows
		// first make the store sort only the first stretch of a long
		// backlog before the first release.
		s.window = min(2*s.window, maxWindow)
	} else {
		s.window = s.hzMs
	}
	return false
}

// raiseAddBound raises addBound to b. A higher bound only makes Added queue
// keys the loop then leaves to the loader, so raising it early is safe.
func (s *Scheduler) raiseAddBound(b int64) {
	if s.addBound.Load() < b {
		s.addBound.Store(b)
	}
}
