package lease

import (
	"context"
	"sync"
	"time"
)

// term is one tenure of the role: lead runs with ctx until cancel.
type term struct {
	epoch  int64
	cancel context.CancelFunc
	done   chan struct{} // closed when lead returned
}

// Run keeps trying to take the role until ctx ends. Each time this node
// takes it, Run starts lead(ctx, epoch) in a goroutine; lead's ctx ends as
// soon as the role is lost (the local deadline passed, or a renewal found
// another epoch) or Run's ctx ends, and Run waits for lead to return before
// it tries again. When ctx ends, Run ends the term, gives the role up in
// the database so that another node takes it at once, and returns.
func (l *Lease) Run(ctx context.Context, lead func(ctx context.Context, epoch int64)) {
	clock := l.cfg.Clock
	timer := clock.NewTimer(l.cfg.Renew)
	defer timer.Stop()
	var cur *term
	var wg sync.WaitGroup // lead's goroutine
	defer wg.Wait()
	end := func(why string) {
		if cur == nil {
			return
		}
		l.mu.Lock()
		l.until = time.Time{}
		l.mu.Unlock()
		cur.cancel()
		<-cur.done
		l.log.Warn("releaser role lost", "role", l.cfg.Role, "epoch", cur.epoch, "why", why)
		cur = nil
		if l.cfg.Metrics != nil {
			l.cfg.Metrics.RoleHeld(false)
		}
	}
	defer func() {
		if cur == nil {
			return
		}
		end("stopping")
		rctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
		defer cancel()
		if err := l.release(rctx); err != nil {
			l.log.Warn("releaser role not given up; it expires by itself", "err", err)
		}
	}()

	for ctx.Err() == nil {
		if l.beforeTry != nil {
			l.beforeTry()
		}
		// A stopped or starved process wakes up here or in the select:
		// the deadline is checked before anything else.
		if cur != nil && !l.Held() {
			end("deadline passed before the renewal")
		}
		sent := clock.Now()
		epoch, ok, err := l.tryBy(ctx, sent, cur != nil)
		now := clock.Now()
		switch {
		case err != nil && ctx.Err() == nil:
			l.log.Warn("releaser role: database unreachable", "err", err)
		case ok && cur != nil && epoch != cur.epoch:
			// Lost and taken back in between: the term that ran is over.
			end("epoch changed")
		}
		if ok && ctx.Err() == nil {
			if until := sent.Add(l.cfg.TTL - l.cfg.Margin); now.Before(until) {
				l.mu.Lock()
				l.until, l.epoch = until, epoch
				l.mu.Unlock()
				if cur == nil {
					cur = l.startTerm(ctx, &wg, epoch, lead)
				}
			}
		}
		// Sleep until the next renewal, or the deadline if earlier.
		wake := sent.Add(l.cfg.Renew)
		if cur != nil {
			l.mu.Lock()
			if l.until.Before(wake) {
				wake = l.until
			}
			l.mu.Unlock()
		}
		timer.ResetAt(wake)
		select {
		case <-ctx.Done():
		case <-timer.C():
		}
		if cur != nil && !l.Held() {
			end("deadline passed")
		}
	}
}

// tryBy is try with a time limit: the local deadline while the role is
// held (a renewal answered later cannot keep it anyway), else the TTL.
func (l *Lease) tryBy(ctx context.Context, sent time.Time, held bool) (int64, bool, error) {
	limit := l.cfg.TTL
	if held {
		l.mu.Lock()
		limit = max(l.until.Sub(sent), time.Millisecond)
		l.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return l.try(ctx)
}

// startTerm starts lead for a new term.
func (l *Lease) startTerm(ctx context.Context, wg *sync.WaitGroup, epoch int64, lead func(context.Context, int64)) *term {
	tctx, cancel := context.WithCancel(ctx)
	t := &term{epoch: epoch, cancel: cancel, done: make(chan struct{})}
	l.log.Info("releaser role taken", "role", l.cfg.Role, "epoch", epoch, "holder", l.cfg.Holder)
	if l.cfg.Metrics != nil {
		l.cfg.Metrics.RoleHeld(true)
	}
	wg.Go(func() {
		defer close(t.done)
		lead(tctx, epoch)
	})
	return t
}
