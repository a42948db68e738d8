package delayproxy

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/lease"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/releaser"
	"github.com/delayproxy/delayproxy/scheduler"
	"github.com/delayproxy/delayproxy/store"
)

// The releaser role in cluster mode. Every node stores delayed publishes;
// only the node holding the lease (package lease) schedules and releases
// them. roleScheduler stands where the one Scheduler stands with the bbolt
// store: the delayed layer, the admin API, the backlog gauges and the
// store's notifications talk to it, and it passes on to the Scheduler of
// the current term, a new one each time the role is taken (it loads its
// horizon from the store), stopped as soon as the role is lost. Its
// Releaser is fenced: every batch is refused (unconfirmed) once the role's
// local deadline has passed, even before the term's Scheduler has stopped.

// releasing is the scheduler as the rest of the node uses it:
// *scheduler.Scheduler with the bbolt store, *roleScheduler in cluster mode.
type releasing interface {
	Added(msgs ...*store.Message)
	Announced(keys ...store.Key)
	Rescan()
	Cancelled(keys ...store.Key)
	DeleteExchange(ctx context.Context, vhost, name string) error
	Overdue() (messages int64, oldest time.Duration)
	Run(ctx context.Context) error
}

var (
	_ releasing = (*scheduler.Scheduler)(nil)
	_ releasing = (*roleScheduler)(nil)
)

// roleScheduler runs a Scheduler while this node holds the releaser role.
type roleScheduler struct {
	st       scheduler.Store
	lease    *lease.Lease
	newSched func(r scheduler.Releaser) *scheduler.Scheduler
	r        scheduler.PipelinedReleaser // unfenced
	log      *slog.Logger

	mu  sync.Mutex           // guards cur
	cur *scheduler.Scheduler // the current term's; nil between terms
}

// openRole opens the lease of the releaser role in schema and returns the
// scheduler that runs only while this node holds it. newSched makes one
// term's Scheduler over the Releaser it is given (r, fenced).
func openRole(ctx context.Context, url, schema string, st scheduler.Store, r scheduler.PipelinedReleaser,
	newSched func(scheduler.Releaser) *scheduler.Scheduler, m *metrics.Metrics, log *slog.Logger) (*roleScheduler, error) {
	l, err := lease.Open(ctx, lease.Config{URL: url, Schema: schema, Logger: log, Metrics: m})
	if err != nil {
		return nil, fmt.Errorf("releaser role: %w", err)
	}
	return &roleScheduler{st: st, lease: l, newSched: newSched, r: r, log: log}, nil
}

// current is the current term's Scheduler, nil between terms.
func (rs *roleScheduler) current() *scheduler.Scheduler {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.cur
}

// Run takes part in the election until ctx ends, runs a Scheduler for each
// term of the role, and closes the lease.
func (rs *roleScheduler) Run(ctx context.Context) error {
	defer rs.lease.Close()
	var errs []error
	rs.lease.Run(ctx, func(ctx context.Context, epoch int64) {
		s := rs.newSched(fencedReleaser{r: rs.r, held: rs.lease.Held})
		rs.mu.Lock()
		rs.cur = s
		rs.mu.Unlock()
		err := s.Run(ctx)
		rs.mu.Lock()
		rs.cur = nil
		rs.mu.Unlock()
		if err != nil {
			rs.log.Error("scheduler stopped", "epoch", epoch, "err", err)
			errs = append(errs, err)
		}
	})
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Added passes stored messages to the current term, if any: a later term
// loads them from the store.
func (rs *roleScheduler) Added(msgs ...*store.Message) {
	if s := rs.current(); s != nil {
		s.Added(msgs...)
	}
}

// Announced passes keys another node stored to the current term, if any:
// a later term loads them from the store.
func (rs *roleScheduler) Announced(keys ...store.Key) {
	if s := rs.current(); s != nil {
		s.Announced(keys...)
	}
}

// Rescan asks the current term, if any, to read its loaded horizon again.
func (rs *roleScheduler) Rescan() {
	if s := rs.current(); s != nil {
		s.Rescan()
	}
}

// Cancelled passes deleted keys to the current term, if any.
func (rs *roleScheduler) Cancelled(keys ...store.Key) {
	if s := rs.current(); s != nil {
		s.Cancelled(keys...)
	}
}

// DeleteExchange removes a delayed exchange: through the current term,
// which counts what it discarded, or from the store directly between
// terms (the releasing node discards the exchange's messages as stale).
func (rs *roleScheduler) DeleteExchange(ctx context.Context, vhost, name string) error {
	if s := rs.current(); s != nil {
		return s.DeleteExchange(ctx, vhost, name)
	}
	_, err := rs.st.DeleteExchange(ctx, vhost, name)
	return err
}

// Overdue is the current term's backlog; none between terms (the releasing
// node reports it).
func (rs *roleScheduler) Overdue() (int64, time.Duration) {
	if s := rs.current(); s != nil {
		return s.Overdue()
	}
	return 0, 0
}

// fencedReleaser publishes only while the role is held by its local
// deadline: a batch handed over later (a term that has not stopped yet, a
// process woken from SIGSTOP) is reported unconfirmed, unpublished, and
// stays in the store for the next holder.
type fencedReleaser struct {
	r    scheduler.PipelinedReleaser
	held func() bool
}

// Release publishes batch if the role is held.
func (f fencedReleaser) Release(ctx context.Context, batch []*store.Message) []bool {
	if !f.held() {
		return make([]bool, len(batch))
	}
	return f.r.Release(ctx, batch)
}

// Publish publishes batch if the role is held.
func (f fencedReleaser) Publish(ctx context.Context, batch []*store.Message) func() []bool {
	if !f.held() {
		return func() []bool { return make([]bool, len(batch)) }
	}
	return f.r.Publish(ctx, batch)
}

// newReleasing is this node's scheduler: with the bbolt store, one
// Scheduler that always releases; in cluster mode (Config.Store), one per
// term of the releaser role.
func (p *Proxy) newReleasing(ctx context.Context, st store.Store, rel *releaser.Releaser, m *metrics.Metrics) (releasing, error) {
	newSched := func(r scheduler.Releaser) *scheduler.Scheduler {
		return scheduler.New(st, r, scheduler.Options{
			Clock: p.clock,
			Rate:  p.cfg.ReleaseRate,
			// The releaser pipelines: batches are published in release
			// order while earlier ones wait for RabbitMQ's confirms, so
			// throughput is not one batch per confirm round trip.
			MaxInFlight:  MaxReleasesInFlight,
			DeleteLinger: ReleaseDeleteLinger,
			ReadAhead:    ReleaseReadAhead,
			Rescan:       p.rescan(),
			Logger:       p.log.With("room", "scheduler"),
			Metrics:      m,
		})
	}
	if p.cfg.Store == "" {
		m.RoleHeld(true)
		return newSched(rel), nil
	}
	return openRole(ctx, p.cfg.Store, p.cfg.StoreSchema, st, rel, newSched, m, p.log.With("room", "releaser-role"))
}
