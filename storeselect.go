package delayproxy

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// openedStore is the store Config selects, with what the metrics read of
// it and where it is, for the start-up log.
type openedStore struct {
	store.Store
	pg      *pgstore.Store // the PostgreSQL store; nil for bbolt
	metrics metrics.Store
	path    string // the bbolt file, whose size the metrics report; "" for PostgreSQL
	where   string // the file, or the database URL without its password
}

// announcer is what hears of messages other nodes stored or cancelled;
// *roleScheduler is one.
type announcer interface {
	AnnouncedIn(anns []pgstore.Announced)
	Cancelled(keys ...store.Key)
	Rescan()
}

// lateAnnouncer passes announcements on to the scheduler once it exists:
// the store opens before it. Before, there is nothing to tell: the
// scheduler's first load reads the store.
type lateAnnouncer struct{ to atomic.Pointer[announcer] }

func (l *lateAnnouncer) set(a announcer) { l.to.Store(&a) }

func (l *lateAnnouncer) announced(anns []pgstore.Announced) {
	if a := l.to.Load(); a != nil {
		(*a).AnnouncedIn(anns)
	}
}

func (l *lateAnnouncer) cancelled(keys []store.Key) {
	if a := l.to.Load(); a != nil {
		(*a).Cancelled(keys...)
	}
}

func (l *lateAnnouncer) missed() {
	if a := l.to.Load(); a != nil {
		(*a).Rescan()
	}
}

// clusterRescan is how often a node on the PostgreSQL store reads its
// loaded horizon again, the backstop of the notifications that bring other
// nodes' messages into its wheel (a lost notification is otherwise also
// caught when the listener reconnects).
const clusterRescan = 10 * time.Second

// clusterReadAhead is how long before their due time a node on the
// PostgreSQL store reads the messages it releases (the scheduler's
// Options.ReadAhead), so the read's round trip, and a stall of the
// database, is not in the release's way. The bbolt file is read at
// release: a read there is a lookup in memory.
const clusterReadAhead = 50 * time.Millisecond

// openStore opens the bbolt file in DataDir, or, when Config.Store is set,
// the PostgreSQL store in Config.StoreSchema, whose announcements of
// messages other nodes stored go to ann. Its error is one line.
func (p *Proxy) openStore(ctx context.Context, m *metrics.Metrics, ann *lateAnnouncer) (*openedStore, error) {
	if p.cfg.Store == "" {
		path, err := p.cfg.EnsureDataDir()
		if err != nil {
			return nil, err
		}
		st, err := boltstore.Open(path, boltstore.Options{Metrics: m, Logger: p.log.With("room", "store")})
		if err != nil {
			return nil, fmt.Errorf("open store %s: %w", path, err)
		}
		return &openedStore{Store: st, metrics: st, path: path, where: path}, nil
	}
	st, err := pgstore.Open(ctx, p.cfg.Store, pgstore.Options{
		Schema:   p.cfg.StoreSchema,
		Metrics:  m,
		OnNotify: ann.announced,
		OnCancel: ann.cancelled,
		OnMissed: ann.missed,
		Logger:   p.log.With("room", "store"),
	})
	if err != nil {
		return nil, err // names the URL, password hidden
	}
	return &openedStore{Store: st, pg: st, metrics: pgMetrics{st}, where: redactURL(p.cfg.Store) + " schema " + p.cfg.StoreSchema}, nil
}

// pgMetrics is a PostgreSQL store as the metrics read it: its counters in
// boltstore's shape, the fields it has.
type pgMetrics struct{ *pgstore.Store }

// Stats converts the store's counters.
func (s pgMetrics) Stats() boltstore.Stats {
	st := s.Store.Stats()
	return boltstore.Stats{
		Commits: st.Commits, FailedCommits: st.FailedCommits, Requests: st.Requests, Messages: st.Messages,
		Deletes: st.Deletes, MaxBatch: st.MaxBatch, CommitTime: st.CommitTime, Stale: st.Stale,
	}
}

// inCluster is d on the shared store (cluster mode), 0 on the bbolt file:
// the scheduler's Options.Rescan (clusterRescan; only this node writes the
// file) and Options.ReadAhead (clusterReadAhead; a read of the file is a
// lookup in memory).
func (p *Proxy) inCluster(d time.Duration) time.Duration {
	if p.cfg.Store == "" {
		return 0
	}
	return d
}
