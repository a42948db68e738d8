package delayproxy

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/lease"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/releaser"
	"github.com/delayproxy/delayproxy/scheduler"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// The releaser roles in cluster mode. Every node stores delayed publishes;
// the messages are divided into pgstore.Partitions partitions (by their
// exchange's incarnation) and each partition is released by the node
// holding its role (package lease), the roles spread over the nodes.
// roleScheduler stands where the one Scheduler stands with the bbolt
// store: the delayed layer, the admin API, the backlog gauges and the
// store's notifications talk to it, and it passes on to the Scheduler of
// the current term, the set of partitions this node holds: a new one each
// time the set changes, on the store's view of those partitions (it loads
// its horizon), started once the previous one has stopped (it waits for its
// in-flight releases). Its Releaser is fenced: a message is refused
// (unconfirmed) once its partition's local deadline has passed, even
// before the term's Scheduler has stopped.

// releasing is the scheduler as the rest of the node uses it:
// *scheduler.Scheduler with the bbolt store, *roleScheduler in cluster mode.
type releasing interface {
	Added(msgs ...*store.Message)
	Rescan()
	Cancelled(keys ...store.Key)
	DeleteExchange(ctx context.Context, vhost, name string) error
	Overdue() (messages int64, oldest time.Duration)
	Run(ctx context.Context) error
}

var (
	_ releasing = (*scheduler.Scheduler)(nil)
	_ releasing = (*roleScheduler)(nil)
	_ announcer = (*roleScheduler)(nil)
)

// roleScheduler runs a Scheduler over the partitions this node holds the
// releaser roles of.
type roleScheduler struct {
	st       *pgstore.Store
	lease    *lease.Lease
	newSched func(st scheduler.Store, r scheduler.Releaser) *scheduler.Scheduler
	r        scheduler.PipelinedReleaser // unfenced
	log      *slog.Logger

	mu    sync.Mutex           // guards cur and parts
	cur   *scheduler.Scheduler // the current term's; nil between terms
	parts []int                // the current term's partitions
}

// openRole opens the lease of the releaser roles in schema and returns the
// scheduler that runs over the partitions this node holds. newSched makes
// one term's Scheduler over the store view and the Releaser it is given
// (r, fenced).
func openRole(ctx context.Context, url, schema string, st *pgstore.Store, r scheduler.PipelinedReleaser,
	newSched func(scheduler.Store, scheduler.Releaser) *scheduler.Scheduler, m *metrics.Metrics, log *slog.Logger) (*roleScheduler, error) {
	l, err := lease.Open(ctx, lease.Config{URL: url, Schema: schema, Partitions: pgstore.Partitions, Logger: log, Metrics: m})
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

// currentIn is the current term's Scheduler and whether its partitions
// include p; nil between terms.
func (rs *roleScheduler) currentIn(p int) (*scheduler.Scheduler, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.cur, slices.Contains(rs.parts, p)
}

// Run takes part in the election until ctx ends, runs a Scheduler for each
// term (set of partitions held), and closes the lease.
func (rs *roleScheduler) Run(ctx context.Context) error {
	defer rs.lease.Close()
	var errs []error
	rs.lease.Run(ctx, func(ctx context.Context, parts []int) {
		s := rs.newSched(rs.st.View(parts), fencedReleaser{r: rs.r, held: rs.lease.Held})
		rs.mu.Lock()
		rs.cur, rs.parts = s, parts
		rs.mu.Unlock()
		err := s.Run(ctx)
		rs.mu.Lock()
		rs.cur, rs.parts = nil, nil
		rs.mu.Unlock()
		if err != nil {
			rs.log.Error("scheduler stopped", "partitions", parts, "err", err)
			errs = append(errs, err)
		}
	})
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Added passes the stored messages of the current term's partitions to
// it: a later term, or another node, loads the others from the store.
func (rs *roleScheduler) Added(msgs ...*store.Message) {
	rs.mu.Lock()
	s, parts := rs.cur, rs.parts
	rs.mu.Unlock()
	if s == nil {
		return
	}
	other := func(m *store.Message) bool { return !slices.Contains(parts, pgstore.PartitionOf(m.Incarnation)) }
	if slices.ContainsFunc(msgs, other) {
		msgs = slices.DeleteFunc(slices.Clone(msgs), other)
	}
	if len(msgs) > 0 {
		s.Added(msgs...)
	}
}

// AnnouncedIn passes the keys other nodes stored in the current term's
// partitions to it (and those of an unknown partition, which its view
// reads as gone if they are not its own).
func (rs *roleScheduler) AnnouncedIn(anns []pgstore.Announced) {
	rs.mu.Lock()
	s, parts := rs.cur, rs.parts
	rs.mu.Unlock()
	if s == nil {
		return
	}
	var keys []store.Key
	for _, a := range anns {
		if a.Partition < 0 || slices.Contains(parts, a.Partition) {
			keys = append(keys, a.Key)
		}
	}
	if len(keys) > 0 {
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

// DeleteExchange removes a delayed exchange: through the current term when
// it holds the exchange's partition, which counts what it discarded, or
// from the store directly (the node releasing the partition discards the
// exchange's messages as stale).
func (rs *roleScheduler) DeleteExchange(ctx context.Context, vhost, name string) error {
	if d, ok := rs.st.Exchange(vhost, name); ok {
		if s, in := rs.currentIn(pgstore.PartitionOf(d.Incarnation)); s != nil && in {
			return s.DeleteExchange(ctx, vhost, name)
		}
	}
	_, err := rs.st.DeleteExchange(ctx, vhost, name)
	return err
}

// Overdue is the current term's backlog: of the partitions this node
// holds; none between terms.
func (rs *roleScheduler) Overdue() (int64, time.Duration) {
	if s := rs.current(); s != nil {
		return s.Overdue()
	}
	return 0, 0
}

// fencedReleaser publishes only the messages whose partition's role is
// held by its local deadline, and only while their term lasts (the ctx of
// the call): one handed over later (a term that has not stopped yet, a
// process woken from SIGSTOP) is reported unconfirmed, unpublished, and
// stays in the store for the partition's next holder. A term that lost a
// role ends before the role is held again (package lease), so a batch
// refused for it is never overtaken by one the same term published after.
type fencedReleaser struct {
	r    scheduler.PipelinedReleaser
	held func(partition int) bool
}

// fence splits batch: the messages it may publish and their indexes in
// batch; all of batch (nil indexes) when every one may be; none once ctx
// (the term) ended. ctx is read after the roles: a role held again came
// after its term's end.
func (f fencedReleaser) fence(ctx context.Context, batch []*store.Message) (pass []*store.Message, at []int) {
	held := make(map[int]bool, 1)
	ok := func(m *store.Message) bool {
		p := pgstore.PartitionOf(m.Incarnation)
		h, seen := held[p]
		if !seen {
			h = f.held(p)
			held[p] = h
		}
		return h
	}
	if !slices.ContainsFunc(batch, func(m *store.Message) bool { return !ok(m) }) {
		pass = batch
	} else {
		for i, m := range batch {
			if ok(m) {
				pass, at = append(pass, m), append(at, i)
			}
		}
	}
	if ctx.Err() != nil {
		return nil, nil
	}
	return pass, at
}

// spread maps the answers for the messages at indexes at back to a batch
// of n; nil at: the answers are the batch's.
func spread(n int, at []int, confirmed []bool) []bool {
	if at == nil {
		return confirmed
	}
	out := make([]bool, n)
	for i, j := range at {
		out[j] = confirmed[i]
	}
	return out
}

// Release publishes the messages of batch whose partition is held.
func (f fencedReleaser) Release(ctx context.Context, batch []*store.Message) []bool {
	pass, at := f.fence(ctx, batch)
	if len(pass) == 0 {
		return make([]bool, len(batch))
	}
	return spread(len(batch), at, f.r.Release(ctx, pass))
}

// Publish publishes the messages of batch whose partition is held; it
// refused the batch when it kept any back.
func (f fencedReleaser) Publish(ctx context.Context, batch []*store.Message) (func() []bool, bool) {
	pass, at := f.fence(ctx, batch)
	if len(pass) == 0 {
		return func() []bool { return make([]bool, len(batch)) }, true
	}
	wait, refused := f.r.Publish(ctx, pass)
	return func() []bool { return spread(len(batch), at, wait()) }, refused || at != nil
}

// newReleasing is this node's scheduler: with the bbolt store, one
// Scheduler that always releases; in cluster mode (pg, the PostgreSQL
// store), one per term of the releaser roles.
func (p *Proxy) newReleasing(ctx context.Context, st store.Store, pg *pgstore.Store, rel *releaser.Releaser, m *metrics.Metrics, sm scheduler.Metrics) (releasing, error) {
	newSched := func(st scheduler.Store, r scheduler.Releaser) *scheduler.Scheduler {
		return scheduler.New(st, r, scheduler.Options{
			Clock: p.clock,
			Rate:  p.cfg.ReleaseRate,
			// The releaser pipelines: batches are published in release
			// order while earlier ones wait for RabbitMQ's confirms, so
			// throughput is not one batch per confirm round trip.
			MaxInFlight:  MaxReleasesInFlight,
			DeleteLinger: ReleaseDeleteLinger,
			Rescan:       p.inCluster(clusterRescan),
			ReadAhead:    p.inCluster(clusterReadAhead),
			Logger:       p.log.With("room", "scheduler"),
			Metrics:      sm,
		})
	}
	if pg == nil {
		m.RolesHeld(1, 1)
		return newSched(st, rel), nil
	}
	return openRole(ctx, p.cfg.Store, p.cfg.StoreSchema, pg, rel, newSched, m, p.log.With("room", "releaser-role"))
}
