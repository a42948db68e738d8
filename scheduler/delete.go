package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The deletes. Confirmed and stale keys are deleted from the store by one
// goroutine at a time, so deletes group into few commits while one runs
// (and for DeleteLinger, if set); only once deleted are they forgotten
// (invariant 2). Until then they stay outstanding, so a rescan that meets
// them does not load them again. More than 4×MaxInFlight keys waiting for
// their delete pause releases, which bounds duplicates after a crash.

// deleteResult is what the delete goroutine reports to the loop.
type deleteResult struct {
	keys []store.Key
	err  error
	// exchange is the exchange delete this goroutine made after deleting
	// keys (exchange.go), if any.
	exchange *exchangeDelete
}

// startDelete starts the delete goroutine on everything waiting, unless one
// is running: deletes of confirmed messages group up while one commits. An
// exchange delete waiting goes first, with everything waiting whatever the
// linger.
func (s *Scheduler) startDelete(ctx context.Context) {
	if s.deleting {
		return
	}
	if s.startExchangeDelete(ctx) || len(s.toDelete) == 0 {
		return
	}
	if !s.stopping && s.clock.Now().Before(s.deleteAt()) {
		return
	}
	keys := s.toDelete
	s.toDelete = nil
	s.deleting = true
	s.wg.Go(func() {
		// Not cancelled with ctx: a confirmed release must be deleted, or
		// it is released again after a restart.
		err := s.st.Delete(context.WithoutCancel(ctx), keys...)
		s.deleted <- deleteResult{keys: keys, err: err}
	})
}

// queueDelete queues confirmed or stale keys for the delete goroutine; they
// stay outstanding until deleted.
func (s *Scheduler) queueDelete(keys []store.Key) {
	if len(s.toDelete) == 0 && len(keys) > 0 {
		s.toDeleteAt = s.clock.Now()
	}
	s.toDelete = append(s.toDelete, keys...)
}

// deleteAt is when the keys waiting may be deleted: after the linger (unless
// enough are waiting) and after the backoff of a failed delete.
func (s *Scheduler) deleteAt() time.Time {
	at := s.deleteAfter
	if len(s.toDelete) < s.opts.MaxInFlight {
		if t := s.toDeleteAt.Add(s.opts.DeleteLinger); t.After(at) {
			at = t
		}
	}
	return at
}

// finishDelete takes the delete goroutine's result in the loop: deleted keys
// are forgotten; a failed delete is retried after a backoff.
func (s *Scheduler) finishDelete(res deleteResult) {
	s.deleting = false
	if res.exchange != nil {
		s.exchangeRemoved(res.exchange)
	}
	if res.err != nil && !s.stopping && !errors.Is(res.err, store.ErrClosed) {
		// Released but still stored (a full disk, say): keep them out of
		// the wheel and try again later, or they would stay pending and be
		// released again after a restart. Dispatch pauses meanwhile once
		// toDelete is long (canDispatch).
		s.delBackoff = min(max(2*s.delBackoff, s.opts.RetryBackoffMin), s.opts.RetryBackoffMax)
		s.deleteAfter = s.clock.Now().Add(s.delBackoff)
		s.queueDelete(res.keys)
		s.log.Error("scheduler: deleting released messages failed, retrying", "messages", len(res.keys), "backoff", s.delBackoff, "err", res.err)
		return
	}
	s.delBackoff = 0
	for _, k := range res.keys {
		delete(s.outstanding, k)
	}
	if res.err != nil {
		// Stopping, or the store is closed: they stay on disk and are
		// released again after a restart (at-least-once).
		s.log.Error("scheduler: deleting released messages failed", "messages", len(res.keys), "err", res.err)
		if errors.Is(res.err, store.ErrClosed) && s.fatal == nil {
			s.fatal = fmt.Errorf("scheduler: delete: %w", res.err)
		}
	}
}
