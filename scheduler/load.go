package scheduler

import (
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The loader. A cursor key splits the stored messages: every key below it
// has been scanned into the wheel (or released since); keys at or above it
// are on disk, and may be in the wheel too (Add of a key held is a no-op).
// When less than half the horizon is loaded, the loader calls ScanKeys from
// the cursor to now+Horizon, at most loadChunk keys per call and at most
// MaxLoaded keys in the wheel, one call at a time in a goroutine of its own
// while the loop goes on releasing. When a key below the cursor must go into
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

// A rescan (Rescan, Options.Rescan) moves the cursor back over keys the
// wheel holds already, to catch the few whose announcement was lost. The
// loader reads that range again in small chunks with a pause between them:
// applying a chunk of keys the wheel holds is a lookup each in the loop,
// and a scan is work for the database on the same cores, so the whole
// horizon at once (tens of thousands of keys) stalled releases every
// Rescan.
const (
	rescanChunk = 512                  // most keys one ScanKeys call of a rescan's re-read loads
	rescanGap   = 5 * time.Millisecond // least time between two of them
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
	if store.CompareKeys(s.cursor, s.rescanTo) < 0 {
		// Reading again what a rescan moved the cursor back over.
		limit = min(limit, rescanChunk)
		if next := s.scannedAt.Add(rescanGap); now.Before(next) {
			return 0, 0, 0, next, false
		}
	}
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

// load starts a scan of the store from the cursor up to now+Horizon, at
// most loadChunk keys, in a goroutine of its own (scanKeys), unless one is
// under way: a scan is a round trip to a database in cluster mode, and the
// loop goes on releasing meanwhile. A rescan that is wanted (rescanWanted)
// goes first: it reads the store's NextDue the same way. The loop applies
// the answer (applyScan, applyRescan).
func (s *Scheduler) load(now time.Time) {
	if s.scanning {
		return
	}
	if s.rescanWanted {
		s.rescanWanted, s.scanning = false, true
		s.wg.Go(func() {
			first, ok := s.st.NextDue()
			s.scanned <- scanResult{rescan: true, first: first, ok: ok}
		})
		return
	}
	from, until, limit, _, ok := s.loadRange(now)
	if !ok {
		return
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
				return
			}
		}
	}
	// Before the scan: a key Added from now on below until is queued, and
	// a key Added before this was stored before the scan began. Until the
	// answer is applied, drainInbox takes the queued ones into the wheel
	// even at or above the cursor (the scan may have passed them).
	s.raiseAddBound(until)
	s.scanning, s.scanUntil = true, until
	start := s.cursor
	if !s.loadedOnce {
		// The first load, before any release: the loop waits for it, so
		// that the first releases and the first measure of the backlog
		// see what it read.
		s.loadedOnce = true
		s.applyScan(now, s.scanKeys(start, from, until, limit))
		return
	}
	s.wg.Go(func() { s.scanned <- s.scanKeys(start, from, until, limit) })
}

// scanResult is a scan's answer (or a rescan's NextDue) for the loop.
type scanResult struct {
	start   store.Key // the cursor when the scan began
	until   int64
	keys    []store.Key // the keys at or above start, in key order
	next    store.Key   // when stopped: the first key not taken
	stopped bool        // limit keys were taken before until
	err     error

	rescan bool  // a rescan's NextDue
	first  int64 // its answer
	ok     bool
}

// scanKeys reads keys from start due before until, at most limit of them.
// It runs in its own goroutine and touches no loop state.
func (s *Scheduler) scanKeys(start store.Key, from, until int64, limit int) scanResult {
	res := scanResult{start: start, until: until}
	res.err = s.st.ScanKeys(from, until, func(k store.Key) error {
		if store.CompareKeys(k, start) < 0 {
			return nil // loaded before, in a millisecond split across chunks
		}
		if len(res.keys) == limit {
			res.next, res.stopped = k, true
			return store.ErrStop
		}
		res.keys = append(res.keys, k)
		return nil
	})
	return res
}

// applyScan takes a scan's answer into the wheel in the loop, and moves the
// cursor past what it read, unless the cursor moved back meanwhile (a
// rescan, a key Added to a full inbox, an eviction): then the range is read
// again from there, and keys already held are no-ops.
func (s *Scheduler) applyScan(now time.Time, res scanResult) {
	s.scanning = false
	if res.rescan {
		if res.ok {
			if k := store.MakeKey(res.first, 255, 0); store.CompareKeys(k, s.cursor) < 0 {
				if store.CompareKeys(s.cursor, s.rescanTo) > 0 {
					s.rescanTo = s.cursor
				}
				s.cursor = k // keys already held are no-ops
			}
		}
		return
	}
	s.scannedAt = now
	if res.err != nil {
		s.storeError("load", res.err)
		return
	}
	for _, k := range res.keys {
		s.addKey(k)
	}
	if s.cursor != res.start {
		return
	}
	if res.stopped {
		s.cursor, s.windowEnd = res.next, res.until
		return
	}
	s.cursor = store.MakeKey(res.until, 255, 0) // the first key due at until
	if res.until < now.UnixMilli()+s.hzMs {
		// Behind (a backlog): scan further next time. Small windows
		// first make the store sort only the first stretch of a long
		// backlog before the first release.
		s.window = min(2*s.window, maxWindow)
	} else {
		s.window = s.hzMs
	}
}

// raiseAddBound raises addBound to b. A higher bound only makes Added queue
// keys the loop then leaves to the loader, so raising it early is safe.
func (s *Scheduler) raiseAddBound(b int64) {
	if s.addBound.Load() < b {
		s.addBound.Store(b)
	}
}
