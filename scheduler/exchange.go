package scheduler

import (
	"context"
	"maps"
)

// The exchange deletes. DeleteExchange removes a delayed exchange from the
// store once RabbitMQ has deleted its real exchange, and counts what that
// discarded: the exchange's messages that were still pending, never one
// that RabbitMQ confirmed. The store counts every message it still holds,
// and holds a confirmed release until its delete commits (DeleteLinger
// included), so the loop goes in three steps:
//
//  1. The delete goroutine deletes every confirmed release waiting for its
//     delete, whatever the linger, then has the store remove the exchange
//     and count its messages. From the moment it starts, the loop counts
//     the exchange's releases RabbitMQ confirms: their deletes come after
//     the store's count, which therefore includes them.
//  2. Once the store has removed the exchange, DeleteExchange returns and no
//     release of the exchange starts: the pipeline reads each batch from
//     the store and skips stale messages. The releases already in flight
//     are awaited, in the loop, so a slow confirm delays the count, never
//     the caller.
//  3. Once they are all answered, the discarded messages, the store's count
//     less the releases confirmed since step 1, go to Metrics.Discarded and
//     the log.
//
// A release in flight that fails (the real exchange is gone: 404) is not
// confirmed: it was counted, and it is deleted unreleased at its retry, its
// exchange being stale. So every message of the exchange is counted once,
// either released or discarded.

// exchangeDelete is one DeleteExchange call, owned by the loop once taken.
type exchangeDelete struct {
	vhost, name string
	answered    chan struct{} // closed once the store has answered (err)

	// Set by the delete goroutine, read by the loop once it has reported.
	pending int64 // the store's count of the exchange's messages
	err     error

	// Loop only.
	inc       uint64              // the exchange's incarnation when the delete goroutine started
	started   bool                // the delete goroutine has taken it
	removed   bool                // the store has answered
	confirmed int64               // releases of inc confirmed since started
	awaiting  map[uint64]struct{} // batches in flight when removed, not yet answered
}

// DeleteExchange removes a delayed exchange from the store
// (Store.DeleteExchange) and returns once it is removed. Call it once
// RabbitMQ has deleted the real exchange, so that releases in flight to it
// fail. When those are answered, the scheduler reports the messages it
// discarded, those still pending, to Metrics.Discarded and the log: releases
// RabbitMQ confirmed before or after the call are not among them, even
// while their store delete lingers. Run must be running or have returned.
func (s *Scheduler) DeleteExchange(ctx context.Context, vhost, name string) error {
	req := &exchangeDelete{vhost: vhost, name: name, answered: make(chan struct{})}
	select {
	case s.exchangeDeletes <- req:
	case <-s.stopped:
		// Nothing is in flight or waiting for its delete any more.
		n, err := s.st.DeleteExchange(ctx, vhost, name)
		if err == nil {
			s.discarded(req, n)
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-req.answered:
		return req.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startExchangeDelete starts the delete goroutine on the first exchange
// delete not yet started, if any, with every key waiting for its delete.
// The delete goroutine must not be running.
func (s *Scheduler) startExchangeDelete(ctx context.Context) bool {
	var req *exchangeDelete
	for _, r := range s.exchangeDels {
		if !r.started {
			req = r
			break
		}
	}
	if req == nil {
		return false
	}
	// An exchange not registered has no incarnation 0 (they start at 1):
	// nothing is counted and the store's DeleteExchange fails.
	def, _ := s.st.Exchange(req.vhost, req.name)
	req.inc, req.started = def.Incarnation, true
	keys := s.toDelete
	s.toDelete = nil
	s.deleting = true
	s.wg.Go(func() {
		// Not cancelled with ctx, as any delete (delete.go).
		ctx := context.WithoutCancel(ctx)
		var err error
		if len(keys) > 0 {
			err = s.st.Delete(ctx, keys...)
		}
		if err == nil {
			req.pending, req.err = s.st.DeleteExchange(ctx, req.vhost, req.name)
		} else {
			// The confirmed releases would be counted as discarded: the
			// exchange stays, and the deleter learns why.
			req.err = err
		}
		s.deleted <- deleteResult{keys: keys, err: err, exchange: req}
	})
	return true
}

// exchangeRemoved takes, in the loop, the store's answer to an exchange
// delete: from now on no release of the exchange starts, and the batches in
// flight are awaited.
func (s *Scheduler) exchangeRemoved(req *exchangeDelete) {
	req.removed = true
	req.awaiting = maps.Clone(s.unanswered)
	close(req.answered)
	s.completeExchangeDeletes()
}

// answeredForExchangeDeletes counts, for the exchange deletes under way, a
// batch's confirmed releases of their exchange, and marks it answered.
func (s *Scheduler) answeredForExchangeDeletes(res releaseResult) {
	if len(s.exchangeDels) == 0 {
		return
	}
	for _, req := range s.exchangeDels {
		if !req.started {
			continue
		}
		for _, inc := range res.releasedInc {
			if inc == req.inc {
				req.confirmed++
			}
		}
		delete(req.awaiting, res.seq)
	}
	s.completeExchangeDeletes()
}

// completeExchangeDeletes reports the exchange deletes whose exchange is
// removed and which have no batch left to await.
func (s *Scheduler) completeExchangeDeletes() {
	kept := s.exchangeDels[:0]
	for _, req := range s.exchangeDels {
		if !req.removed || len(req.awaiting) > 0 {
			kept = append(kept, req)
			continue
		}
		if req.err == nil {
			s.discarded(req, req.pending-req.confirmed)
		}
	}
	clear(s.exchangeDels[len(kept):])
	s.exchangeDels = kept
}

// discarded reports the n pending messages an exchange delete discarded.
func (s *Scheduler) discarded(req *exchangeDelete, n int64) {
	if n <= 0 {
		return
	}
	if s.opts.Metrics != nil {
		s.opts.Metrics.Discarded(int(n))
	}
	s.log.Info("delayed exchange deleted, pending messages discarded", "vhost", req.vhost, "exchange", req.name, "discarded", n)
}
