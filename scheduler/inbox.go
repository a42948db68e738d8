package scheduler

import (
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The inbox. Added and Cancelled append to a mutex-guarded inbox (at most
// maxInbox keys between two loop turns) and wake the loop; they never wait
// for it. Keys due at or after addBound, the upper end of the range the
// loader has started to scan, are ignored: that end is published
// (atomically) before the scan begins, and Added is called after Put
// returned, so such a message is seen by that scan or a later one. The loop
// takes an inbox key into the wheel only if it is below the cursor, or
// below the end of the scan under way (which may have read the store
// before the key was stored); otherwise a later scan reads it from disk.
// A key may arrive both ways
// (stored before the scan began, announced after): the wheel ignores the
// second Add, and keys out for release or awaiting their delete are
// remembered (outstanding) and skipped. When the inbox is full, Added
// records the smallest key it dropped and the loop moves the cursor back to
// it, so the loader scans that range again (keys already held are no-ops).
// A Cancelled that is dropped is harmless: release reads every message from
// the store first and skips the ones that are gone (with ReadAhead, a
// message read before its cancel is released, as one cancelled while it
// is published).

// maxInbox is the most keys Added or Cancelled queue between two loop turns.
const maxInbox = 1 << 16

// Added tells the scheduler that msgs were stored (call it after Put
// returned). A message due within the loaded horizon goes into the wheel; a
// later one stays on disk until the loader reaches it. It never blocks on
// the loop: when its bounded inbox is full, the loader reads the message
// from disk instead.
func (s *Scheduler) Added(msgs ...*store.Message) {
	s.queueAdds(len(msgs), func(i int) store.Key { return msgs[i].Key })
}

// Announced tells the scheduler of keys another node stored (the store's
// notification, delivered after their commit): Added for keys alone.
func (s *Scheduler) Announced(keys ...store.Key) {
	s.queueAdds(len(keys), func(i int) store.Key { return keys[i] })
}

// Rescan makes the loader read the loaded horizon again from the store's
// earliest key: the store may have missed announcements (its listener
// reconnected). It never blocks on the loop.
func (s *Scheduler) Rescan() {
	s.mu.Lock()
	s.rescan = true
	s.mu.Unlock()
	s.kick()
}

// queueAdds queues the n keys key(0) .. key(n-1) for the loop.
func (s *Scheduler) queueAdds(n int, key func(int) store.Key) {
	bound := s.addBound.Load()
	queued := false
	s.mu.Lock()
	for i := range n {
		k := key(i)
		if k.Due() >= bound {
			continue
		}
		queued = true
		if len(s.adds) < s.maxInbox {
			s.adds = append(s.adds, k)
		} else if !s.hasMissed || store.CompareKeys(k, s.missed) < 0 {
			s.missed, s.hasMissed = k, true
		}
	}
	s.mu.Unlock()
	if queued {
		s.kick()
	}
}

// Cancelled tells the scheduler that keys were deleted from the store (call
// it after the delete returned). It wakes the loop, which takes them out of
// the wheel at once, before it releases anything else, so they no longer
// count against MaxLoaded. It never blocks on the loop. A key already handed
// to the Releaser is released anyway. When the inbox is full the key stays
// in the wheel until its due time and is then skipped, since the store no
// longer has it (unless it was read ahead before the cancel).
func (s *Scheduler) Cancelled(keys ...store.Key) {
	bound := s.addBound.Load()
	queued := false
	s.mu.Lock()
	for _, k := range keys {
		if k.Due() >= bound || len(s.cancels) >= s.maxInbox {
			continue
		}
		s.cancels = append(s.cancels, k)
		queued = true
	}
	s.mu.Unlock()
	if queued {
		s.kick()
	}
}

// drainInbox moves what Added and Cancelled queued into the wheel, and
// asks the loader for a rescan that is due.
func (s *Scheduler) drainInbox(now time.Time) {
	s.mu.Lock()
	adds, cancels := s.adds, s.cancels
	s.adds, s.cancels = s.spare[:0], nil
	missed, hasMissed := s.missed, s.hasMissed
	s.hasMissed = false
	rescan := s.rescan
	s.rescan = false
	s.mu.Unlock()

	if s.opts.Rescan > 0 && !now.Before(s.rescanAt) {
		rescan, s.rescanAt = true, now.Add(s.opts.Rescan)
	}
	if rescan {
		s.rescanWanted = true // the loader reads NextDue (load)
	}

	for _, k := range adds {
		if store.CompareKeys(k, s.cursor) >= 0 && (!s.scanning || k.Due() >= s.scanUntil) {
			continue // the loader has not passed it: it reads it from disk
		}
		s.addKey(k)
	}
	for _, k := range cancels {
		s.w.Cancel(k)
	}
	if hasMissed && store.CompareKeys(missed, s.cursor) < 0 {
		s.cursor = missed // scan again from there; keys already held are no-ops
	}
	clear(adds)
	s.spare = adds[:0]
}
