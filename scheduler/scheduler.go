package scheduler

import (
	"context"
	"errors"
	"fmt"
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
	// that reports, per message, whether RabbitMQ confirmed it.
	Publish(ctx context.Context, batch []*store.Message) (wait func() (confirmed []bool))
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
	// Logger receives errors and retries. Default slog.Default().
	Logger *slog.Logger

	// The hooks below are optional, for metrics. They are called from the
	// scheduler's goroutines and must be quick and safe for concurrent use.

	// OnReleased is called for each message RabbitMQ confirmed, with how
	// long after its due time it was published: written, for a
	// PipelinedReleaser (Publish returned); handed over, for a Releaser.
	OnReleased func(m *store.Message, lateness time.Duration)
	// OnDiscarded is called with the number of messages dropped because
	// their exchange was deleted or re-created.
	OnDiscarded func(n int)
	// OnRetry is called with the number of messages whose release was not
	// confirmed and will be retried.
	OnRetry func(n int)
}

const (
	maxWindow = int64(1) << 40 // ms, far beyond any backlog
	loadChunk = 4096           // most keys one ScanKeys call loads
	maxInbox  = 1 << 16        // most keys Added or Cancelled queue between wakes
	maxSleep  = time.Second    // longest timer, so wall-clock jumps are noticed
)

// Scheduler loads due keys from the store into a Wheel and releases them in
// order, never early. See the package doc.
type Scheduler struct {
	st    Store
	r     Releaser
	opts  Options
	clock Clock
	log   *slog.Logger
	hzMs  int64 // Horizon in ms

	// addBound is the upper end (unix ms, exclusive) of the range the
	// loader has started to scan; Added ignores keys due at or after it,
	// since a later scan will find them on disk. Raised before each scan.
	addBound atomic.Int64
	running  atomic.Bool

	mu        sync.Mutex // guards adds, cancels, missed, hasMissed and maxInbox
	adds      []store.Key
	cancels   []store.Key
	missed    store.Key // smallest key Added dropped for a full inbox
	hasMissed bool

	notify  chan struct{}      // wakes the loop; capacity 1
	results chan releaseResult // from the release pipeline; never blocks
	deleted chan deleteResult  // from the delete goroutine; never blocks
	wg      sync.WaitGroup     // pipeline, Release and delete goroutines

	// Owned by the loop goroutine.
	w           *Wheel
	cursor      store.Key              // keys >= cursor are on disk only
	window      int64                  // ms a new scan window may cover beyond the cursor
	windowEnd   int64                  // end of the current scan window, continued in chunks
	jumped      bool                   // the cursor has skipped to the first stored key
	outstanding map[store.Key]struct{} // out of the wheel, not yet answered or deleted
	inflight    int                    // messages in Release calls
	calls       int                    // Release calls running
	maxCalls    int                    // most Release calls at once
	jobs        chan []store.Key       // dispatched batches, to publishLoop
	toDelete    []store.Key            // confirmed or stale, waiting for the delete goroutine
	deleting    bool
	toDeleteAt  time.Time     // when toDelete last became non-empty
	deleteAfter time.Time     // no delete before this (after a failed one)
	delBackoff  time.Duration // wait after the next failed delete
	backoff     time.Duration
	holdUntil   time.Time // no release before this (retry backoff)
	loadAfter   time.Time // no load before this (after a store error)
	tokens      float64   // rate limiter bucket
	tokensAt    time.Time
	spare       []store.Key
	fatal       error
	stopping    bool // Run is waiting for the last releases

	maxInbox  int               // maxInbox, lowered by tests
	testBegin func()            // tests: called as each loop iteration begins
	idle      func(nowMs int64) // tests: called when the loop waits with nothing in progress
}

type releaseResult struct {
	del   []store.Key // confirmed or stale: delete them
	retry []store.Key // not confirmed: back into the wheel
	gone  []store.Key // no longer in the store (cancelled)
	n     int         // messages the batch held
	stale int
	err   error // reading the store failed; every key is in retry
}

type deleteResult struct {
	keys []store.Key
	err  error
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
		outstanding: make(map[store.Key]struct{}),
		backoff:     opts.RetryBackoffMin,
		maxInbox:    maxInbox,
		maxCalls:    maxCalls(r, opts),
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

// Added tells the scheduler that msgs were stored (call it after Put
// returned). A message due within the loaded horizon goes into the wheel; a
// later one stays on disk until the loader reaches it. It never blocks on
// the loop: when its bounded inbox is full, the loader reads the message
// from disk instead.
func (s *Scheduler) Added(msgs ...*store.Message) {
	bound := s.addBound.Load()
	queued := false
	s.mu.Lock()
	for _, m := range msgs {
		k := m.Key
		if k.Due() >= bound {
			continue
		}
		queued = true
		if len(s.adds) < s.maxInbox {
			s.adds = append(s.adds, k)
		} else if !s.hasMissed || store.CompareKeys(k, s.missed) < 0 {
			s.missed, s.hasMissed = k, true
		}
	}
	s.mu.Unlock()
	if queued {
		s.kick()
	}
}

// Cancelled tells the scheduler that keys were deleted from the store, so it
// drops them from the wheel. A key already handed to the Releaser is
// released anyway. When the inbox is full the key stays in the wheel and is
// skipped at release, since the store no longer has it.
func (s *Scheduler) Cancelled(keys ...store.Key) {
	bound := s.addBound.Load()
	queued := false
	s.mu.Lock()
	for _, k := range keys {
		if k.Due() >= bound || len(s.cancels) >= s.maxInbox {
			continue
		}
		s.cancels = append(s.cancels, k)
		queued = true
	}
	s.mu.Unlock()
	if queued {
		s.kick()
	}
}

func (s *Scheduler) kick() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Run releases due messages until ctx ends or the store is closed. It
// returns after every release it started has returned (they see ctx end)
// and every confirmed message is deleted; nil when ctx ended, else the
// store's error. A message published but not yet confirmed when ctx ends
// stays stored and is released again by the next run (at-least-once).
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	now := s.clock.Now()
	s.w = NewWheel(now.UnixMilli(), s.hzMs)
	s.tokens, s.tokensAt = s.burst(), now
	timer := s.clock.NewTimer(maxSleep)
	defer timer.Stop()
	ctx, cancel := context.WithCancel(ctx) // also ends releases after a store failure
	defer cancel()
	s.jobs = make(chan []store.Key, s.maxCalls)
	waits := make(chan published, s.maxCalls)
	s.wg.Go(func() { s.publishLoop(ctx, s.jobs, waits) })
	s.wg.Go(func() { s.confirmLoop(waits) })

	for ctx.Err() == nil && s.fatal == nil {
		if s.testBegin != nil {
			s.testBegin()
		}
		now := s.clock.Now()
		s.drainInbox()
		more := s.load(now)
		s.dispatch(now)
		s.startDelete(ctx)
		wait := s.nextWake(now, more)
		// wait counts from now, read before this turn's work: the timer
		// is armed for that instant, or a slow turn (or a fake clock moved
		// meanwhile) would make the wake-up late by that much.
		timer.ResetAt(now.Add(wait))
		if wait > 0 && s.idle != nil && s.inflight == 0 && !s.deleting {
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
		}
	}

	// Wait for the releases in flight, then delete what they confirmed.
	cancel()
	close(s.jobs) // the pipeline ends once it has answered every batch
	s.stopping = true
	for s.inflight > 0 || s.deleting || len(s.toDelete) > 0 {
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

// drainInbox moves what Added and Cancelled queued into the wheel.
func (s *Scheduler) drainInbox() {
	s.mu.Lock()
	adds, cancels := s.adds, s.cancels
	s.adds, s.cancels = s.spare[:0], nil
	missed, hasMissed := s.missed, s.hasMissed
	s.hasMissed = false
	s.mu.Unlock()

	for _, k := range adds {
		if store.CompareKeys(k, s.cursor) >= 0 {
			continue // the loader has not passed it: it reads it from disk
		}
		s.addKey(k)
	}
	for _, k := range cancels {
		s.w.Cancel(k)
	}
	if hasMissed && store.CompareKeys(missed, s.cursor) < 0 {
		s.cursor = missed // scan again from there; keys already held are no-ops
	}
	clear(adds)
	s.spare = adds[:0]
}

// addKey puts a key below the cursor into the wheel unless it is already out
// for release; if that makes the wheel too big, the latest key goes back to
// being on disk only.
func (s *Scheduler) addKey(k store.Key) {
	if _, out := s.outstanding[k]; out {
		return
	}
	if !s.w.Add(k) || s.w.Len() <= s.opts.MaxLoaded {
		return
	}
	last, _ := s.w.Last()
	s.w.Cancel(last)
	if store.CompareKeys(last, s.cursor) < 0 {
		s.cursor = last
	}
}

// loadRange is what the loader would scan now: keys from the cursor due
// before until, at most limit of them. ok is false when there is nothing to
// do, and then wake is when there will be (zero: when something else
// changes).
func (s *Scheduler) loadRange(now time.Time) (from, until int64, limit int, wake time.Time, ok bool) {
	nowMs := now.UnixMilli()
	from = s.cursor.Due()
	if from > nowMs+s.hzMs/2 {
		// More than half the horizon is loaded.
		return 0, 0, 0, time.UnixMilli(from - s.hzMs/2), false
	}
	if now.Before(s.loadAfter) {
		return 0, 0, 0, s.loadAfter, false
	}
	limit = min(s.opts.MaxLoaded-s.w.Len(), loadChunk)
	end := from + s.window
	if from < s.windowEnd {
		end = s.windowEnd // the rest of a window scanned in chunks
	}
	until = min(nowMs+s.hzMs, s.w.Horizon()+1, end)
	if limit <= 0 || until <= from {
		return 0, 0, 0, time.Time{}, false // until release makes room
	}
	return from, until, limit, now, true
}

// load scans the store from the cursor up to now+Horizon into the wheel, at
// most loadChunk keys at a time. It reports whether more is ready to load.
func (s *Scheduler) load(now time.Time) bool {
	from, until, limit, _, ok := s.loadRange(now)
	if !ok {
		return false
	}
	if !s.jumped {
		// Skip the empty past: start at the first stored key. A key
		// stored before the bound is raised is seen by NextDue; one
		// stored later is queued by Added.
		s.jumped = true
		bound := now.UnixMilli() + s.hzMs
		s.raiseAddBound(bound)
		if first, ok := s.st.NextDue(); ok && first > from {
			// Not past the bound: a key due after it, stored from now
			// on, is left by Added to a scan.
			s.cursor = store.MakeKey(min(first, bound), 255, 0)
			if from, until, limit, _, ok = s.loadRange(now); !ok {
				return false
			}
		}
	}
	// Before the scan: a key Added from now on below until is queued, and
	// a key Added before this was stored before the scan began.
	s.raiseAddBound(until)
	n := 0
	var next store.Key
	stopped := false
	err := s.st.ScanKeys(from, until, func(k store.Key) error {
		if store.CompareKeys(k, s.cursor) < 0 {
			return nil // loaded before, in a millisecond split across chunks
		}
		if n == limit {
			next, stopped = k, true
			return store.ErrStop
		}
		n++
		s.addKey(k)
		return nil
	})
	if err != nil {
		s.storeError("load", err)
		return false
	}
	if stopped {
		s.cursor, s.windowEnd = next, until
		return true
	}
	s.cursor = store.MakeKey(until, 255, 0) // the first key due at until
	if until < now.UnixMilli()+s.hzMs {
		// Behind (a backlog): scan further next time. Small windows
		// first make the store sort only the first stretch of a long
		// backlog before the first release.
		s.window = min(2*s.window, maxWindow)
	} else {
		s.window = s.hzMs
	}
	return false
}

// raiseAddBound raises addBound to b. A higher bound only makes Added queue
// keys the loop then leaves to the loader, so raising it early is safe.
func (s *Scheduler) raiseAddBound(b int64) {
	if s.addBound.Load() < b {
		s.addBound.Store(b)
	}
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

// dispatch hands due keys to the release pipeline while limits allow.
func (s *Scheduler) dispatch(now time.Time) {
	if now.Before(s.holdUntil) {
		return
	}
	nowMs := now.UnixMilli()
	for s.canDispatch() {
		n := min(s.opts.BatchSize, s.opts.MaxInFlight-s.inflight)
		if s.opts.Rate > 0 {
			s.refill(now)
			n = min(n, int(s.tokens))
			if n == 0 {
				return
			}
		}
		batch := s.w.ExpireN(nowMs, nil, n)
		if len(batch) == 0 {
			return
		}
		if s.opts.Rate > 0 {
			s.tokens -= float64(len(batch))
		}
		for _, k := range batch {
			s.outstanding[k] = struct{}{}
		}
		s.inflight += len(batch)
		s.calls++
		s.jobs <- batch // never blocks: it holds maxCalls
	}
}

// canDispatch reports whether the in-flight limits allow another batch. A
// backlog of deletes also holds release back, so it cannot grow unbounded.
func (s *Scheduler) canDispatch() bool {
	return s.calls < s.maxCalls && s.inflight < s.opts.MaxInFlight && len(s.toDelete) < 4*s.opts.MaxInFlight
}

// burst is the rate limiter's bucket size: 100 ms of the rate, within
// [1, BatchSize].
func (s *Scheduler) burst() float64 {
	return min(max(s.opts.Rate/10, 1), float64(s.opts.BatchSize))
}

func (s *Scheduler) refill(now time.Time) {
	if d := now.Sub(s.tokensAt); d > 0 {
		s.tokens = min(s.tokens+d.Seconds()*s.opts.Rate, s.burst())
	}
	s.tokensAt = now
}

// publishLoop is the release pipeline's first stage, one goroutine: it
// takes dispatched batches in dispatch order, reads them from the store,
// drops what is gone or stale and hands the rest to the Releaser. It does
// not wait for confirms (confirmLoop does), so batches go out one after
// another, in order, with one hand-off between the loop and the wire.
func (s *Scheduler) publishLoop(ctx context.Context, jobs <-chan []store.Key, waits chan<- published) {
	defer close(waits)
	publish := s.publishFunc()
	for keys := range jobs {
		res := releaseResult{n: len(keys)}
		msgs, err := s.st.Get(keys)
		if err != nil {
			res.err, res.retry = err, keys
			s.results <- res
			continue
		}
		live := make([]*store.Message, 0, len(msgs))
		for i, m := range msgs {
			switch {
			case m == nil:
				res.gone = append(res.gone, keys[i])
			case s.st.Stale(m):
				res.del = append(res.del, keys[i])
				res.stale++
			default:
				live = append(live, m)
			}
		}
		if len(live) == 0 {
			s.results <- res
			continue
		}
		wait := publish(ctx, live)
		// A PipelinedReleaser has written the batch by now; a plain
		// Releaser has only been started.
		waits <- published{res: res, live: live, at: s.clock.Now(), wait: wait}
	}
}

// published is a batch handed to the Releaser, awaiting its confirms.
type published struct {
	res  releaseResult
	live []*store.Message
	at   time.Time // when Publish returned
	wait func() (confirmed []bool)
}

// confirmLoop is the release pipeline's second stage, one goroutine: it
// awaits the confirms of each published batch, in order, and reports the
// result to the loop.
func (s *Scheduler) confirmLoop(waits <-chan published) {
	for p := range waits {
		confirmed := p.wait()
		res := p.res
		for i, m := range p.live {
			if i < len(confirmed) && confirmed[i] {
				res.del = append(res.del, m.Key)
				if s.opts.OnReleased != nil {
					s.opts.OnReleased(m, p.at.Sub(time.UnixMilli(m.Key.Due())))
				}
			} else {
				res.retry = append(res.retry, m.Key)
			}
		}
		s.results <- res
	}
}

// publishFunc is how publishLoop hands a batch over: a PipelinedReleaser's
// Publish, or a plain Release call started in a goroutine of its own, so
// that up to MaxInFlight/BatchSize calls overlap and start in order.
func (s *Scheduler) publishFunc() func(ctx context.Context, batch []*store.Message) (wait func() []bool) {
	if pr, ok := s.r.(PipelinedReleaser); ok {
		return pr.Publish
	}
	return func(ctx context.Context, batch []*store.Message) func() []bool {
		done := make(chan []bool, 1)
		s.wg.Go(func() { done <- s.r.Release(ctx, batch) })
		return func() []bool { return <-done }
	}
}

// finish takes a release's result in the loop.
func (s *Scheduler) finish(res releaseResult) {
	s.inflight -= res.n
	s.calls--
	for _, k := range res.gone {
		delete(s.outstanding, k)
	}
	s.queueDelete(res.del)
	if res.stale > 0 && s.opts.OnDiscarded != nil {
		s.opts.OnDiscarded(res.stale)
	}
	if res.err != nil {
		s.storeError("get", res.err)
	}
	if len(res.retry) == 0 {
		if len(res.del) > 0 {
			s.backoff = s.opts.RetryBackoffMin
		}
		return
	}
	// Back into the wheel, ahead of everything due later, and hold all
	// releases for the backoff so order is kept.
	for _, k := range res.retry {
		delete(s.outstanding, k)
		s.addKey(k)
	}
	if s.stopping {
		return // cut short by shutdown: they stay stored for the next run
	}
	s.holdUntil = s.clock.Now().Add(s.backoff)
	if res.err == nil {
		s.log.Warn("scheduler: releases not confirmed, retrying", "messages", len(res.retry), "backoff", s.backoff)
	}
	s.backoff = min(2*s.backoff, s.opts.RetryBackoffMax)
	if s.opts.OnRetry != nil {
		s.opts.OnRetry(len(res.retry))
	}
}

// startDelete starts the delete goroutine on everything waiting, unless one
// is running: deletes of confirmed messages group up while one commits.
func (s *Scheduler) startDelete(ctx context.Context) {
	if s.deleting || len(s.toDelete) == 0 {
		return
	}
	if !s.stopping && s.clock.Now().Before(s.deleteAt()) {
		return
	}
	keys := s.toDelete
	s.toDelete = nil
	s.deleting = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Not cancelled with ctx: a confirmed release must be deleted, or
		// it is released again after a restart.
		err := s.st.Delete(context.WithoutCancel(ctx), keys...)
		s.deleted <- deleteResult{keys, err}
	}()
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

func (s *Scheduler) finishDelete(res deleteResult) {
	s.deleting = false
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

// nextWake is how long the loop may sleep: until the next due key it could
// release, the next load, the end of a backoff or rate-limit wait, and never
// longer than maxSleep, so a wall-clock jump forward is noticed.
func (s *Scheduler) nextWake(now time.Time, loadMore bool) time.Duration {
	if loadMore {
		return 0
	}
	at := now.Add(maxSleep)
	earlier := func(t time.Time) {
		if t.Before(at) {
			at = t
		}
	}
	if _, _, _, wake, _ := s.loadRange(now); !wake.IsZero() {
		earlier(wake)
	}
	if len(s.toDelete) > 0 && !s.deleting {
		earlier(s.deleteAt())
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
