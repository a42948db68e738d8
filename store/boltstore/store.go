package boltstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/delayproxy/delayproxy/store"
)

// exKey names a delayed exchange.
type exKey struct{ vhost, name string }

// Store is a durable timing wheel of delayed messages in one bbolt file.
// All methods are safe for concurrent use.
//
// Counts are kept per incarnation, in memory and in meta within the
// transaction of the change, so that deleting a stale message decrements
// its stale incarnation, never the live one: Pending is the sum over live
// incarnations, Stats().Stale the sum over the others.
type Store struct {
	db       *bolt.DB
	path     string
	opts     Options
	slotMs   int64 // slot width in ms, as recorded in the file
	farMs    int64 // far bucket width in ms, as recorded in the file
	leadMs   int64
	maxBatch int
	passMax  int // most messages per cascade pass (cascadePassMax; tests lower it)
	// journalMax is the most messages journaled before a checkpoint
	// (journalMaxMessages; tests lower it).
	journalMax int
	// idsGoneMax is the most ids entries left waiting after a commit
	// (maxIDsGone; tests lower it).
	idsGoneMax uint64
	// idleCheckpoint is how long the writer waits without a request
	// before it checkpoints the journaled messages in the background
	// (idleCheckpointAfter; 0: never, for tests that keep them journaled).
	idleCheckpoint time.Duration
	scanHook       func() // tests: runs in the cascade scan goroutine before it scans

	nextSeq atomic.Uint64 // next sequence handed out to Put

	reqs chan *request // to the writer goroutine
	done chan struct{} // closed when the writer has exited

	// closeMu guards closed. Senders on reqs hold it for reading, so Close
	// never closes reqs under a sender.
	closeMu sync.RWMutex
	closed  bool

	// mu guards the in-memory copy of committed state below. Only the
	// writer goroutine changes it (under mu, after a successful commit), so
	// the writer itself may read it without mu.
	mu        sync.RWMutex
	exchanges map[exKey]store.ExchangeDef
	// liveInc maps the live incarnations to their exchanges (liveIncs).
	// recount replaces the map, never changes one, so that Put checks its
	// messages' exchanges without mu.
	liveInc   atomic.Pointer[map[uint64]exKey]
	counts    map[uint64]int64 // stored messages per incarnation (absent: 0)
	live      int64            // sum of counts of live incarnations
	stale     int64            // sum of counts of other incarnations
	watermark int64            // due < watermark: slots; due >= watermark: far buckets
	farMin    int64            // earliest due in far buckets (math.MaxInt64: none), when farMinOK
	farMinOK  bool
	tally     map[int64]*tallyRow // stored messages by due minute, a row per hour (see tally.go)
	ov        overlays            // journaled messages not yet in bbolt (overlay.go)

	// Writer-only state (no lock: touched by the writer goroutine alone).
	incCounter   uint64 // last incarnation handed out
	persistedSeq uint64 // next sequence as recorded in meta
	// goneFirst and goneNext bound the keys of the ids-gone bucket as
	// last committed: [goneFirst, goneNext) (idsgone.go).
	goneFirst, goneNext uint64
	scan                *cascadeScan // cascade pass in progress
	// slotCounts holds, per slot with released messages, its entries and
	// released marks as last committed: it tells when a slot may be all
	// released, which two counting walks then prove before the drop.
	slotCounts map[int64]slotCount
	jr         *journal // the journal in front of bbolt (journal.go)
	// journalFailed: an append failed since the last checkpoint, so the
	// journal takes nothing until a checkpoint moves it to a new
	// generation.
	journalFailed bool
	// checkpointFull: the last checkpoint failed for want of room in
	// bbolt, so the journal takes nothing more until one succeeds.
	checkpointFull bool
	// ckDone is the background checkpoint's outcome, nil when none runs
	// (checkpoint.go).
	ckDone chan error

	fileVersion uint64 // Open: the file's schema version before any upgrade (set by load)

	// statsMu guards stats.
	statsMu sync.Mutex
	stats   Stats
}

// liveIncs maps the live incarnations to their exchanges. The map is
// never changed: recount replaces it.
func (s *Store) liveIncs() map[uint64]exKey { return *s.liveInc.Load() }

// recount rebuilds liveInc and the live/stale totals. Callers hold mu for
// writing (or own s exclusively).
func (s *Store) recount() {
	liveInc := make(map[uint64]exKey, len(s.exchanges))
	for k, d := range s.exchanges {
		liveInc[d.Incarnation] = k
	}
	s.liveInc.Store(&liveInc)
	s.live, s.stale = 0, 0
	for inc, n := range s.counts {
		if _, ok := liveInc[inc]; ok {
			s.live += n
		} else {
			s.stale += n
		}
	}
}

// Close waits for the requests already queued to be committed, writes
// bbolt's freelist (so that the next Open need not rebuild it) and closes
// the file. Calls after the first return ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	close(s.reqs)
	s.closeMu.Unlock()
	<-s.done
	var err error
	if !s.opts.SyncFreelist {
		// Write bbolt's freelist once, so that the next Open loads it
		// instead of walking every page of the file to rebuild it.
		s.db.NoFreelistSync = false
		err = s.db.Update(func(*bolt.Tx) error { return nil })
	}
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	if cerr := s.jr.close(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}

// view runs fn in a read transaction, mapping a closed database to ErrClosed.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	err := s.db.View(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return store.ErrClosed
	}
	return err
}

// do hands r to the writer and waits for its commit. When ctx ends first, do
// returns ctx.Err() and r may or may not be committed.
func (s *Store) do(ctx context.Context, r *request) error {
	if err := s.enqueue(ctx, r); err != nil {
		return err
	}
	return s.await(ctx, r)
}

// enqueue queues r for the writer.
func (s *Store) enqueue(ctx context.Context, r *request) error {
	r.ctx = ctx
	r.done = make(chan struct{})
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	select {
	case s.reqs <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// await waits for the writer's answer to r, queued by enqueue.
func (s *Store) await(ctx context.Context, r *request) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		select {
		case <-r.done:
			return r.err
		default:
			return ctx.Err()
		}
	}
}

var _ store.Store = (*Store)(nil)
