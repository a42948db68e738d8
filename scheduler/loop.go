package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The loop. One goroutine, Run's, owns the wheel and all loop state; each
// turn it drains the inbox, loads, dispatches due keys and starts a delete,
// then sleeps until the earliest of: the next due key it may release, the
// next load, the end of a backoff or rate-limit wait, a result from the
// pipeline or the delete goroutine, a wake from Added or Cancelled, and
// maxSleep.
//
// The release decision is due <= now, in milliseconds of the injected
// clock's wall time, read after the timer fired: a timer that fires early
// or late changes when the loop looks, never what it releases (invariant
// 3). If the wall clock goes back, nothing is released until it reaches
// each message's due time again: the wheel keeps its position and holds
// keys due before it until then, and the loader loads nothing new until
// now+Horizon passes the cursor. If it goes forward, everything now overdue
// is released at once, at Rate if one is set.

// maxSleep is the loop's longest timer, so a wall-clock jump is noticed
// within it (timers run on the monotonic clock).
const maxSleep = time.Second

// Run releases due messages until ctx ends or the store is closed. It
// returns after every release it started has returned (they see ctx end)
// and every confirmed message is deleted; nil when ctx ended, else the
// store's error. A message published but not yet confirmed when ctx ends
// stays stored and is released again by the next run (at-least-once).
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer close(s.stopped)
	now := s.clock.Now()
	s.w = NewWheel(now.UnixMilli(), s.hzMs)
	s.tokens, s.tokensAt = s.burst(), now
	timer := s.clock.NewTimer(maxSleep)
	defer timer.Stop()
	ctx, cancel := context.WithCancel(ctx) // also ends releases after a store failure
	defer cancel()
	s.readTo = s.w.Now()
	s.reads = make(chan []store.Key, readsQueued)
	s.jobs = make(chan batchJob, s.maxCalls)
	waits := make(chan published, s.maxCalls)
	s.wg.Go(func() { s.publishLoop(ctx, s.jobs, waits) })
	s.wg.Go(func() { s.confirmLoop(waits) })

	for ctx.Err() == nil && s.fatal == nil {
		if s.testBegin != nil {
			s.testBegin()
		}
		now := s.clock.Now()
		s.drainInbox(now)
		s.load(now)
		s.dispatch(now)
		s.readAhead(now)
		s.startDelete(ctx)
		s.sampleProgress(now)
		wait := s.nextWake(now)
		// wait counts from now, read before this turn's work: the timer
		// is armed for that instant, or a slow turn (or a fake clock moved
		// meanwhile) would make the wake-up late by that much.
		timer.ResetAt(now.Add(wait))
		if wait > 0 && s.idle != nil && s.inflight == 0 && !s.deleting && !s.scanning && s.readsOut.Load() == 0 {
			s.idle(now.UnixMilli())
		}
		select {
		case <-ctx.Done():
		case <-timer.C():
		case <-s.notify:
		case res := <-s.results:
			s.finish(res)
		case res := <-s.deleted:
			s.finishDelete(res)
		case res := <-s.scanned:
			s.applyScan(s.clock.Now(), res)
		case req := <-s.exchangeDeletes:
			s.exchangeDels = append(s.exchangeDels, req)
		}
	}

	// Wait for the releases in flight, then delete what they confirmed and
	// finish the exchange deletes already taken.
	cancel()
	close(s.jobs) // the pipeline ends once it has answered every batch
	s.stopping = true
	for s.inflight > 0 || s.deleting || len(s.toDelete) > 0 || len(s.exchangeDels) > 0 {
		s.startDelete(ctx)
		select {
		case res := <-s.results:
			s.finish(res)
		case res := <-s.deleted:
			s.finishDelete(res)
		}
	}
	s.wg.Wait()
	return s.fatal
}

// kick wakes the loop; it never blocks.
func (s *Scheduler) kick() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// nextWake is how long the loop may sleep: until the next due key it could
// release, the next read ahead, the next load, the end of a backoff or
// rate-limit wait, and never
// longer than maxSleep, so a wall-clock jump forward is noticed.
func (s *Scheduler) nextWake(now time.Time) time.Duration {
	at := now.Add(maxSleep)
	earlier := func(t time.Time) {
		if t.Before(at) {
			at = t
		}
	}
	if !s.scanning { // else its answer wakes the loop
		if _, _, _, wake, _ := s.loadRange(now); !wake.IsZero() {
			earlier(wake)
		}
	}
	if len(s.toDelete) > 0 && !s.deleting {
		earlier(s.deleteAt())
	}
	if t, ok := s.readAheadWake(); ok {
		earlier(t)
	}
	if next, ok := s.w.Next(); ok && s.canDispatch() {
		t := time.UnixMilli(next)
		if t.Before(s.holdUntil) {
			t = s.holdUntil
		}
		if s.opts.Rate > 0 {
			if want := min(max(s.opts.Rate/100, 1), s.burst()); s.tokens < want {
				t2 := s.tokensAt.Add(time.Duration((want - s.tokens) / s.opts.Rate * float64(time.Second)))
				if t2.After(t) {
					t = t2
				}
			}
		}
		earlier(t)
	}
	return max(at.Sub(now), 0)
}

// storeError logs err; store.ErrClosed ends Run, anything else pauses loading.
func (s *Scheduler) storeError(op string, err error) {
	if errors.Is(err, store.ErrClosed) {
		s.fatal = fmt.Errorf("scheduler: %s: %w", op, err)
		return
	}
	s.log.Error("scheduler: store failed", "op", op, "err", err)
	s.loadAfter = s.clock.Now().Add(s.opts.RetryBackoffMin)
}
