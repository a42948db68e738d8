package lease

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// term is one tenure of a set of roles: lead runs with ctx until cancel.
type term struct {
	parts  []int
	cancel context.CancelFunc
	ending bool          // cancelled: waiting for lead to return
	done   chan struct{} // closed when lead returned
}

// runner is the state of one Run, owned by its goroutine.
type runner struct {
	l       *Lease
	lead    func(ctx context.Context, parts []int)
	wg      *sync.WaitGroup // lead's goroutines
	cur     *term           // the current term, or the one ending; nil between terms
	leaving []bool          // roles given up, not yet expired in the database
	changes int             // roles taken or lost since the last report to Metrics
}

// Run keeps this node's share of the roles until ctx ends. Every tick (one
// renew interval) it heartbeats the node, renews the roles it holds and
// reads the roles and the live nodes in one round trip, then takes roles in
// a second one if it should (plan). Each time the set of roles it holds
// changes, or one of them is lost however briefly, it ends the current
// term: lead's ctx ends, and once lead has returned, Run starts lead(ctx,
// parts) for the new set, if not empty.
// Run does not wait for lead while it renews: the other roles stay held.
// When ctx ends, Run ends the term, waits for lead, gives every role up in
// the database so that other nodes take them at once, and returns.
func (l *Lease) Run(ctx context.Context, lead func(ctx context.Context, parts []int)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	r := &runner{l: l, lead: lead, wg: &wg, leaving: make([]bool, l.cfg.Partitions)}
	defer r.stop()
	clock := l.cfg.Clock
	timer := clock.NewTimer(l.cfg.Renew)
	defer timer.Stop()
	for ctx.Err() == nil {
		if l.beforeTick != nil {
			l.beforeTick()
		}
		// A stopped or starved process wakes up here or in the select:
		// the deadlines are checked before anything else.
		r.dropPassed("deadline passed before the renewal")
		sent := clock.Now()
		r.tick(ctx, sent)
		r.sync(ctx)
		// Sleep until the next tick, or the first deadline if earlier;
		// start the next term as soon as the ending one is over.
		wake := sent.Add(l.cfg.Renew)
		if d := l.firstDeadline(); !d.IsZero() && d.Before(wake) {
			wake = d
		}
		timer.ResetAt(wake)
	sleep:
		for {
			var ended <-chan struct{}
			if r.cur != nil && r.cur.ending {
				ended = r.cur.done
			}
			select {
			case <-ctx.Done():
				break sleep
			case <-timer.C():
				break sleep
			case <-ended:
				r.sync(ctx)
			}
		}
		r.dropPassed("deadline passed")
		r.sync(ctx)
	}
}

// firstDeadline is the earliest local deadline of the roles held, zero
// when none is.
func (l *Lease) firstDeadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, u := range l.until {
		if !u.IsZero() && (first.IsZero() || u.Before(first)) {
			first = u
		}
	}
	return first
}

// drop stops holding role p locally (Held is false from now on) and ends
// the term that used it, even if the role is taken again at once; level is
// the level of the log line.
func (r *runner) drop(p int, level slog.Level, why string) {
	l := r.l
	l.mu.Lock()
	epoch := l.epoch[p]
	l.until[p] = time.Time{}
	l.mu.Unlock()
	r.changes++
	l.log.Log(context.Background(), level, "releaser role lost", "partition", p, "epoch", epoch, "why", why)
	r.endTermOf(p)
}

// endTermOf ends the current term if it uses role p. A term that lost a
// role, however briefly, is over: the fence refused the role's actions
// while it was not held, and what the term had started after those must
// not pass the fence once the role is held again, or it would overtake
// them. The term's ctx ends here, before the role can be taken again.
func (r *runner) endTermOf(p int) {
	if r.cur != nil && !r.cur.ending && slices.Contains(r.cur.parts, p) {
		r.cur.ending = true
		r.cur.cancel()
	}
}

// dropPassed drops the roles whose local deadline has passed.
func (r *runner) dropPassed(why string) {
	l := r.l
	now := l.cfg.Clock.Now()
	for p := range l.cfg.Partitions {
		l.mu.Lock()
		passed := !l.until[p].IsZero() && !now.Before(l.until[p])
		l.mu.Unlock()
		if passed {
			r.drop(p, slog.LevelWarn, why)
		}
	}
}

// keep records that role p, taken, is held by epoch until the local
// deadline.
func (r *runner) keep(p int, epoch int64, until time.Time) {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until[p], l.epoch[p] = until, epoch
}

// extend moves the local deadline of role p, renewed, to until, unless the
// deadline it had passed while the renewal was out: the role was not held
// meanwhile (Held said so), and extend reports false. It reads the clock
// under the lock, as Held does, so the two agree on which came first.
func (l *Lease) extend(p int, until time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until[p].IsZero() || !l.cfg.Clock.Now().Before(l.until[p]) {
		return false
	}
	l.until[p] = until
	return true
}

// sync ends the current term when the roles held are no longer its set,
// starts the next one once it is over, and reports the changes.
func (r *runner) sync(ctx context.Context) {
	l := r.l
	set := l.heldSet()
	if r.changes > 0 && l.cfg.Metrics != nil {
		l.cfg.Metrics.RolesHeld(len(set), r.changes)
	}
	r.changes = 0
	if r.cur != nil && !r.cur.ending && !slices.Equal(r.cur.parts, set) {
		r.cur.ending = true
		r.cur.cancel()
	}
	if r.cur != nil && r.cur.ending {
		select {
		case <-r.cur.done:
			r.cur = nil
		default:
			return
		}
	}
	if r.cur == nil && len(set) > 0 && ctx.Err() == nil {
		r.cur = r.start(ctx, set)
	}
}

// start starts lead for a term of the roles parts.
func (r *runner) start(ctx context.Context, parts []int) *term {
	tctx, cancel := context.WithCancel(ctx)
	t := &term{parts: parts, cancel: cancel, done: make(chan struct{})}
	r.l.log.Info("releaser roles held", "partitions", parts, "holder", r.l.cfg.Holder)
	r.wg.Go(func() {
		defer close(t.done)
		r.lead(tctx, parts)
	})
	return t
}

// tick is one heartbeat, renewal and reading of the roles, then the takes
// and the give-up it calls for. Errors are logged: the roles stay held
// until their local deadlines.
func (r *runner) tick(ctx context.Context, sent time.Time) {
	l := r.l
	held := make([]bool, l.cfg.Partitions)
	for _, p := range l.heldSet() {
		held[p] = true
	}
	// Expire the roles given up once no term uses them any more.
	var expire []int
	if r.cur == nil || !r.cur.ending {
		for p, lv := range r.leaving {
			if lv && (r.cur == nil || !slices.Contains(r.cur.parts, p)) {
				expire = append(expire, p)
			}
		}
	}
	res, err := l.exchange(ctx, sent, held, expire)
	now := l.cfg.Clock.Now()
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("releaser roles: database unreachable", "err", err)
		}
		return
	}
	for _, p := range expire {
		r.leaving[p] = false
	}
	until := sent.Add(l.cfg.TTL - l.cfg.Margin)
	for p, h := range held {
		if !h {
			continue
		}
		l.mu.Lock()
		epoch := l.epoch[p]
		l.mu.Unlock()
		switch e, ok := res.renewed[p]; {
		case !ok:
			r.drop(p, slog.LevelWarn, "renewal refused")
			held[p] = false
		case e != epoch:
			r.drop(p, slog.LevelWarn, "epoch changed")
			held[p] = false
		case !now.Before(until):
			r.drop(p, slog.LevelWarn, "renewal answered past the deadline")
			held[p] = false
		case !l.extend(p, until):
			r.drop(p, slog.LevelWarn, "deadline passed during the renewal")
			held[p] = false
		}
	}
	take, giveUp := plan(held, r.leaving, res.roles, res.nodes)
	if len(take) > 0 && ctx.Err() == nil {
		sent := l.cfg.Clock.Now()
		taken, err := l.take(ctx, take)
		now := l.cfg.Clock.Now()
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("releaser roles: cannot take", "err", err)
			}
			return
		}
		until := sent.Add(l.cfg.TTL - l.cfg.Margin)
		if !now.Before(until) {
			return // expires by itself, unused
		}
		for p, epoch := range taken {
			r.keep(p, epoch, until)
			r.changes++
			l.log.Info("releaser role taken", "partition", p, "epoch", epoch, "holder", l.cfg.Holder, "nodes", res.nodes)
		}
	}
	if giveUp >= 0 {
		// Not used from now on; expired in the database once the term
		// that used it is over.
		r.drop(giveUp, slog.LevelInfo, "given up for another node: above its share")
		r.leaving[giveUp] = true
	}
}

// stop ends the term, waits for lead, and gives every role up in the
// database at once, as well as the node's heartbeat (a graceful stop).
func (r *runner) stop() {
	l := r.l
	for _, p := range l.heldSet() {
		r.drop(p, slog.LevelInfo, "stopping")
	}
	if r.changes > 0 && l.cfg.Metrics != nil {
		l.cfg.Metrics.RolesHeld(0, r.changes)
	}
	if r.cur != nil {
		r.cur.cancel()
		<-r.cur.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
	defer cancel()
	if err := l.leave(ctx); err != nil {
		l.log.Warn("releaser roles not given up; they expire by themselves", "err", err)
	}
}
