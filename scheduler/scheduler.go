package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// Sentinel errors of the scheduler.
var (
	// ErrRunning: Run was called on a scheduler that has already run.
	ErrRunning = errors.New("scheduler: Run called twice")
)

// Store is the part of store.Store the scheduler uses.
type Store interface {
	// ScanKeys calls fn for each key due in [from, until) in key order;
	// fn returns store.ErrStop to end the scan early.
	ScanKeys(from, until int64, fn func(store.Key) error) error
	// Get reads messages by key; an entry is nil when the key is gone.
	Get(keys []store.Key) ([]*store.Message, error)
	// Stale reports whether m's exchange was deleted or re-created since m
	// was stored: m is discarded, not released.
	Stale(m *store.Message) bool
	// Delete removes keys durably (a group commit).
	Delete(ctx context.Context, keys ...store.Key) error
	// NextDue is the earliest due time stored, if any.
	NextDue() (int64, bool)
	// Upcoming counts the stored messages by due time in consecutive
	// ranges (store.Store.Upcoming); the backlog's measure asks it for the
	// messages due but not loaded yet.
	Upcoming(bounds []int64) []int64
	// Exchange looks a delayed exchange up in the registry, from memory.
	Exchange(vhost, name string) (store.ExchangeDef, bool)
	// DeleteExchange removes a delayed exchange from the registry and
	// returns how many of its messages the store still held unreleased.
	DeleteExchange(ctx context.Context, vhost, name string) (int64, error)
}

var _ Store = store.Store(nil)

// Releaser publishes due messages upstream.
type Releaser interface {
	// Release publishes a batch in the given order and reports, per message,
	// whether RabbitMQ confirmed it. Unconfirmed ones are retried with
	// backoff. Release may be called by several goroutines at once when
	// Options.MaxInFlight exceeds Options.BatchSize.
	Release(ctx context.Context, batch []*store.Message) (confirmed []bool)
}

// PipelinedReleaser is a Releaser that publishes a batch and awaits its
// confirms apart. The scheduler then keeps several batches in flight and
// still hands them over in release order: Publish is called for one batch
// at a time, in order, and wait is called after, concurrently with later
// batches' Publish. Throughput is then no longer one batch per confirm
// round trip.
type PipelinedReleaser interface {
	Releaser
	// Publish publishes batch in the given order and returns a function
	// that reports, per message, whether RabbitMQ confirmed it. refused is
	// true when Publish wrote some of batch nowhere (no connection, a
	// failure just before, a role not held): the scheduler then publishes
	// nothing it dispatched before it took those messages back, so that
	// nothing overtakes them.
	Publish(ctx context.Context, batch []*store.Message) (wait func() (confirmed []bool), refused bool)
}

// Options configure a Scheduler. The zero value gives the defaults.
type Options struct {
	// Clock is the wall clock and timer source; default the system clock.
	Clock Clock
	// Horizon is how far ahead of now keys are loaded from the store into
	// the wheel. Default 1 minute.
	Horizon time.Duration
	// BatchSize is the most messages handed to one Release call. Default 256.
	BatchSize int
	// MaxInFlight is the most messages handed to the Releaser and not yet
	// answered; MaxInFlight/BatchSize (rounded up) Release calls run at
	// once. Default BatchSize: one call at a time, so release order is exact
	// across batches. With more, batches overlap and their relative order
	// is up to the Releaser.
	MaxInFlight int
	// MaxLoaded is the most keys held in memory (about 40 bytes each). When
	// more are due within the horizon, the latest wait on disk and are
	// loaded as earlier ones leave. Default 262144.
	MaxLoaded int
	// Rate limits releases to this many messages per second; 0 is no limit.
	Rate float64
	// DeleteLinger is how long confirmed releases wait before their store
	// delete starts, unless MaxInFlight of them are waiting, so that deletes
	// group into fewer commits (fsyncs). A crash before the delete releases
	// them again; releases pause while 4×MaxInFlight wait, so duplicates
	// stay bounded by 5×MaxInFlight as without a linger. Default 0: a
	// delete starts as soon as the previous one has committed.
	DeleteLinger time.Duration
	// RetryBackoffMin and RetryBackoffMax bound the exponential wait after
	// a release that was not confirmed. Defaults 100 ms and 30 s.
	RetryBackoffMin, RetryBackoffMax time.Duration
	// Rescan, when positive, makes the loader read the loaded horizon
	// again from the store's NextDue every Rescan: the backstop for keys
	// another node stored whose announcement (Announced) was lost. Keys
	// already held are no-ops. Default 0: never, as a store only this
	// scheduler's node writes to needs.
	Rescan time.Duration
	// ReadAhead, when positive, is how long before their due time
	// messages are read from the store (readahead.go), so a store whose
	// reads are round trips to a database (pgstore) does not put them in
	// the releases' way. Default 0: each batch is read when it is due, as
	// a store in this process (boltstore) needs.
	ReadAhead time.Duration
	// Logger receives errors and retries. Default slog.Default().
	Logger *slog.Logger

	// Metrics receives release counts; nil is none.
	Metrics Metrics
}

// Metrics is what the scheduler reports about releases; *metrics.Metrics
// has it. It is called from the release pipeline's goroutines and must be
// quick and safe for concurrent use.
type Metrics interface {
	// Released counts n messages RabbitMQ confirmed.
	Released(n int)
	// ReleaseLateness observes, for each confirmed message, how long after
	// its due time it was published: written, for a PipelinedReleaser
	// (Publish returned); handed over, for a Releaser.
	ReleaseLateness(late time.Duration)
	// Discarded counts n pending messages discarded with their deleted
	// exchange (DeleteExchange).
	Discarded(n int)
}

// Scheduler loads due keys from the store into a Wheel and releases them in
// order, never early. See the package doc.
type Scheduler struct {
	st    Store
	r     Releaser
	opts  Options
	clock Clock
	log   *slog.Logger
	hzMs  int64 // Horizon in ms

	running         atomic.Bool
	notify          chan struct{}        // wakes the loop; capacity 1
	results         chan releaseResult   // from the release pipeline; never blocks
	deleted         chan deleteResult    // from the delete goroutine; never blocks
	exchangeDeletes chan *exchangeDelete // DeleteExchange calls, to the loop
	stopped         chan struct{}        // closed when Run returns
	wg              sync.WaitGroup       // pipeline, Release and delete goroutines

	// The inbox (inbox.go), shared by Added, Cancelled and the loop.

	// addBound is the upper end (unix ms, exclusive) of the range the
	// loader has started to scan; Added ignores keys due at or after it,
	// since a later scan will find them on disk. Raised before each scan.
	addBound  atomic.Int64
	mu        sync.Mutex // guards adds, cancels, missed, hasMissed, rescan and maxInbox
	adds      []store.Key
	cancels   []store.Key
	missed    store.Key // smallest key Added dropped for a full inbox
	hasMissed bool
	rescan    bool        // Rescan was called: read the loaded horizon again
	maxInbox  int         // maxInbox, lowered by tests
	spare     []store.Key // the loop's emptied adds array, for reuse

	// Everything below is owned by the loop goroutine.

	// The wheel and its loader (load.go).
	w            *Wheel
	cursor       store.Key // keys >= cursor are on disk only
	window       int64     // ms a new scan window may cover beyond the cursor
	windowEnd    int64     // end of the current scan window, continued in chunks
	rescanAt     time.Time // the next periodic rescan (Options.Rescan)
	jumped       bool      // the cursor has skipped to the first stored key
	loadAfter    time.Time // no load before this (after a store error)
	loadedOnce   bool      // the first scan is done (the loop waited for it)
	scanning     bool      // a scan (or a rescan's NextDue) is under way
	scanUntil    int64     // the end of the scan under way
	scanned      chan scanResult
	rescanWanted bool      // a rescan is due: the loader reads NextDue first
	rescanTo     store.Key // the cursor a rescan moved back from: below it, scans are paced
	scannedAt    time.Time // when the last scan's answer was applied

	// The release pipeline (release.go).
	outstanding map[store.Key]struct{} // out of the wheel, not yet answered or deleted
	inflight    int                    // messages in Release calls
	calls       int                    // Release calls running
	maxCalls    int                    // most Release calls at once
	jobs        chan batchJob          // dispatched batches, to publishLoop
	batchSeq    uint64                 // sequence number of the last dispatched batch
	refusalsIn  uint64                 // refused batches taken back (finish): batchJob.refusalsIn
	unanswered  map[uint64]struct{}    // sequence numbers of the batches in flight
	backoff     time.Duration          // retry backoff after the next unconfirmed release
	holdUntil   time.Time              // no release before this (retry backoff)
	tokens      float64                // rate limiter bucket
	tokensAt    time.Time              // when tokens was last refilled

	// The read-ahead (readahead.go).
	readTo   int64            // keys due at or before it were handed to reads, if ever
	reads    chan []store.Key // keys to read ahead, to fetchLoop
	readsOut atomic.Int32     // reads ahead sent and not yet answered by the store

	// The deletes (delete.go).
	toDelete    []store.Key   // confirmed or stale, waiting for the delete goroutine
	deleting    bool          // the delete goroutine runs
	toDeleteAt  time.Time     // when toDelete last became non-empty
	deleteAfter time.Time     // no delete before this (after a failed one)
	delBackoff  time.Duration // wait after the next failed delete

	prog progress // the backlog's measure and the progress lines (progress.go)
	// The exchange deletes (exchange.go), in the order they came.
	exchangeDels []*exchangeDelete

	fatal    error // ends Run: the store is closed
	stopping bool  // Run is waiting for the last releases

	testBegin func()            // tests: called as each loop iteration begins
	idle      func(nowMs int64) // tests: called when the loop waits with nothing in progress
}

// New returns a Scheduler over st that releases through r. Call Run to start
// it; Added and Cancelled may be called before Run.
func New(st Store, r Releaser, opts Options) *Scheduler {
	if opts.Clock == nil {
		opts.Clock = RealClock{}
	}
	if opts.Horizon <= 0 {
		opts.Horizon = time.Minute
	}
	if opts.Horizon < 2*time.Millisecond {
		opts.Horizon = 2 * time.Millisecond
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 256
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = opts.BatchSize
	}
	if opts.MaxLoaded <= 0 {
		opts.MaxLoaded = 1 << 18
	}
	if opts.RetryBackoffMin <= 0 {
		opts.RetryBackoffMin = 100 * time.Millisecond
	}
	if opts.RetryBackoffMax < opts.RetryBackoffMin {
		opts.RetryBackoffMax = max(30*time.Second, opts.RetryBackoffMin)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Scheduler{
		st:          st,
		r:           r,
		opts:        opts,
		clock:       opts.Clock,
		log:         opts.Logger,
		hzMs:        opts.Horizon.Milliseconds(),
		window:      opts.Horizon.Milliseconds(),
		notify:      make(chan struct{}, 1),
		results:     make(chan releaseResult, opts.MaxInFlight),
		deleted:     make(chan deleteResult, 1),
		scanned:     make(chan scanResult, 1),
		outstanding: make(map[store.Key]struct{}),
		unanswered:  make(map[uint64]struct{}),
		backoff:     opts.RetryBackoffMin,
		maxInbox:    maxInbox,
		maxCalls:    maxCalls(r, opts),

		exchangeDeletes: make(chan *exchangeDelete),
		stopped:         make(chan struct{}),
	}
}

// maxCalls is how many release calls may run at once: enough for
// MaxInFlight messages in full batches, or, for a PipelinedReleaser, as many
// as there are messages in flight (batches are small when releases are
// spread out in time, and each waits a confirm round trip).
func maxCalls(r Releaser, opts Options) int {
	if _, ok := r.(PipelinedReleaser); ok {
		return opts.MaxInFlight
	}
	return (opts.MaxInFlight + opts.BatchSize - 1) / opts.BatchSize
}
