package scheduler

import (
	"context"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The release pipeline. The loop takes due keys from the wheel (dispatch)
// and three goroutines carry each batch to RabbitMQ and back, in dispatch
// order:
//
//	loop ──batch keys──▶ fetchLoop ──▶ publishLoop ──published──▶ confirmLoop
//	  ▲                  (Get, a few      (Publish)                (wait confirms)
//	  │                   batches ahead)
//	  └──────────────────────────results──────────────────────────────┘
//
// fetchLoop reads each batch from the store, a few batches ahead;
// publishLoop holds each message until its due millisecond (a batch holds
// keys due up to ReadAhead later, behind the due ones), skips keys that
// are gone (cancelled), collects stale ones (exchange deleted or
// re-created: deleted, never released) and hands the rest to the
// Releaser; confirmLoop awaits the confirms. A plain (not pipelined) Releaser gets one goroutine per Release
// call, at most MaxInFlight/BatchSize at once. The loop then queues
// confirmed and stale keys for their delete (delete.go) and puts
// unconfirmed ones back into the wheel.

// batchJob is a dispatched batch: the keys to release, in order.
type batchJob struct {
	seq  uint64 // numbers the batches in dispatch order
	keys []store.Key
}

// releaseResult is what the pipeline reports to the loop for one part of
// a batch: the keys published together (a batch read ahead goes out in
// parts, as they fall due), with those found gone or stale before them.
type releaseResult struct {
	seq   uint64      // the batch's batchJob.seq
	last  bool        // the batch's last part: the batch is answered
	del   []store.Key // confirmed or stale: delete them
	retry []store.Key // not confirmed: back into the wheel
	gone  []store.Key // no longer in the store (cancelled)
	n     int         // messages of the batch this part answers
	acked int         // confirmed by RabbitMQ (in del)
	err   error       // reading the store failed; every key is in retry
	// releasedInc holds the exchange incarnation of each message RabbitMQ
	// confirmed, for the exchange deletes' count (exchange.go).
	releasedInc []uint64
}

// dispatch hands due keys to the release pipeline while limits allow: at
// most BatchSize per batch, MaxInFlight in flight, and within Rate (a token
// bucket holding 100 ms of the rate). With ReadAhead, a batch also takes
// the keys due within ReadAhead after now, behind the due ones.
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
		if s.aheadMs > 0 {
			batch = s.expireAhead(nowMs, batch, n)
		}
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
		s.batchSeq++
		s.unanswered[s.batchSeq] = batch
		s.jobs <- batchJob{seq: s.batchSeq, keys: batch} // never blocks: it holds maxCalls
	}
}

// expireAhead appends to batch, up to n keys in all, the keys due within
// ReadAhead after nowMs: one millisecond at a time, in due order, each
// millisecond's keys in release order, so that publishLoop can publish a
// batch's keys as each falls due. A batch of keys not due yet starts only
// once the next of them is due within half of ReadAhead, so that each
// takes about half of ReadAhead's keys (one store read) rather than one
// millisecond's. It stops while the wheel is behind (its due queues hold
// keys): those go first, once due.
func (s *Scheduler) expireAhead(nowMs int64, batch []store.Key, n int) []store.Key {
	if next, ok := s.w.Next(); len(batch) == 0 && (!ok || next > nowMs+s.aheadMs/2) {
		return batch
	}
	for len(batch) < n && s.w.due.n == 0 {
		next, ok := s.w.Next()
		if !ok || next > nowMs+s.aheadMs {
			break
		}
		batch = s.w.ExpireN(next, batch, n-len(batch))
	}
	return batch
}

// aheadOf counts the keys of the batches in flight not yet due at nowMs:
// dispatched ahead (ReadAhead), so not overdue.
func (s *Scheduler) aheadOf(nowMs int64) int {
	if s.aheadMs == 0 {
		return 0
	}
	n := 0
	for _, keys := range s.unanswered {
		// The keys dispatched ahead come last, in due order.
		for i := len(keys) - 1; i >= 0 && keys[i].Due() > nowMs; i-- {
			n++
		}
	}
	return n
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
// takes dispatched batches in dispatch order, as read from the store by
// fetchLoop, and hands them to the Releaser, each message once its due
// millisecond has come (a batch read ahead goes out in parts, as its keys
// fall due), leaving out what is gone (cancelled) or stale. It does not
// wait for confirms (confirmLoop does), so batches go out one after
// another, in order, with one hand-off between the loop and the wire.
func (s *Scheduler) publishLoop(ctx context.Context, jobs <-chan batchJob, waits chan<- published) {
	defer close(waits)
	publish := s.publishFunc()
	fetched := make(chan *fetch, s.maxCalls) // every batch in flight fits
	s.wg.Go(func() { s.fetchLoop(jobs, fetched) })
	timer := s.clock.NewTimer(maxSleep)
	timer.Stop()
	defer timer.Stop()
	for f := range fetched {
		<-f.done
		keys := f.job.keys
		res := releaseResult{seq: f.job.seq}
		if f.err != nil {
			res.err, res.retry, res.n, res.last = f.err, keys, len(keys), true
			waits <- published{res: res}
			continue
		}
		msgs := make([]*store.Message, 0, len(f.msgs))
		for i, m := range f.msgs {
			if m == nil {
				res.gone = append(res.gone, keys[i])
				res.n++
			} else {
				msgs = append(msgs, m)
			}
		}
		for len(msgs) > 0 {
			// The first message is due, and releases are not held for a
			// retry (a part read ahead must not overtake one that failed).
			if !s.awaitDue(ctx, timer, msgs[0].Key.Due()) || s.clock.Now().UnixNano() < s.holdNs.Load() {
				for _, m := range msgs {
					res.retry = append(res.retry, m.Key)
				}
				res.n += len(msgs)
				break
			}
			nowMs := s.clock.Now().UnixMilli()
			i := 1
			for i < len(msgs) && msgs[i].Key.Due() <= nowMs {
				i++
			}
			part := msgs[:i]
			msgs = msgs[i:]
			res.n += len(part)
			live := make([]*store.Message, 0, len(part))
			for _, m := range part {
				switch {
				case s.withdrawn.take(m.Key):
					res.gone = append(res.gone, m.Key)
				case s.st.Stale(m):
					res.del = append(res.del, m.Key)
				default:
					live = append(live, m)
				}
			}
			if len(live) == 0 {
				continue
			}
			wait := publish(ctx, live)
			// A PipelinedReleaser has written the part by now; a plain
			// Releaser has only been started.
			res.last = len(msgs) == 0
			waits <- published{res: res, live: live, at: s.clock.Now(), wait: wait}
			if res.last {
				break
			}
			res = releaseResult{seq: res.seq}
		}
		if !res.last {
			res.last = true
			waits <- published{res: res}
		}
	}
}

// awaitDue waits until the clock's wall time reaches the due millisecond,
// and reports false if ctx ended first. The clock is read again after each
// wake-up: a timer decides when to look, never what goes (invariant 3).
func (s *Scheduler) awaitDue(ctx context.Context, timer Timer, due int64) bool {
	at := time.UnixMilli(due)
	for s.clock.Now().Before(at) {
		timer.ResetAt(at)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C():
		}
	}
	return true
}

// maxGets is how many store reads of dispatched batches run at once. A
// store whose Get is a round trip to a database (pgstore) would otherwise
// bound release to one batch per round trip; the batches are small when
// release keeps up (what fell due since the last turn, or one millisecond
// of keys read ahead). A message cancelled after its read is published
// anyway unless the cancel reaches the scheduler first (withdrawn).
const maxGets = 4

// fetch is one dispatched batch being read from the store.
type fetch struct {
	job  batchJob
	msgs []*store.Message
	err  error
	done chan struct{} // closed once msgs and err are set
}

// fetchLoop starts the store read of each dispatched batch as it comes,
// maxGets at once, and hands them on in dispatch order. It never waits
// for publishLoop, which holds a batch read ahead until it falls due: the
// reads of the batches behind it go on meanwhile.
func (s *Scheduler) fetchLoop(jobs <-chan batchJob, fetched chan<- *fetch) {
	defer close(fetched)
	gets := make(chan struct{}, maxGets)
	for job := range jobs {
		f := &fetch{job: job, done: make(chan struct{})}
		gets <- struct{}{}
		s.wg.Go(func() {
			defer func() { <-gets }()
			f.msgs, f.err = s.st.Get(job.keys)
			close(f.done)
		})
		fetched <- f // never blocks: it holds every batch in flight
	}
}

// published is a part of a batch handed to the Releaser, awaiting its
// confirms (none when live is empty), with what publishLoop found of the
// batch since the previous part.
type published struct {
	res  releaseResult
	live []*store.Message
	at   time.Time // when Publish returned
	wait func() (confirmed []bool)
}

// confirmLoop is the release pipeline's second stage, one goroutine: it
// awaits the confirms of each published part, in order, counts them and
// reports the part's result to the loop.
func (s *Scheduler) confirmLoop(waits <-chan published) {
	for p := range waits {
		res := p.res
		if p.wait != nil {
			s.confirmed(&res, p)
		}
		s.results <- res
	}
}

// confirmed awaits a published part's confirms and adds them to res.
func (s *Scheduler) confirmed(res *releaseResult, p published) {
	confirmed := p.wait()
	released := 0
	for i, m := range p.live {
		if i < len(confirmed) && confirmed[i] {
			res.del = append(res.del, m.Key)
			res.releasedInc = append(res.releasedInc, m.Incarnation)
			released++
			if s.opts.Metrics != nil {
				s.opts.Metrics.ReleaseLateness(p.at.Sub(time.UnixMilli(m.Key.Due())))
			}
		} else {
			res.retry = append(res.retry, m.Key)
		}
	}
	res.acked += released
	if released > 0 && s.opts.Metrics != nil {
		s.opts.Metrics.Released(released)
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

// finish takes a batch's result in the loop. Keys not confirmed go back into
// the wheel, among the due ones and first of their priority, and all
// releases pause for the retry backoff (doubling from RetryBackoffMin to
// RetryBackoffMax, reset by a confirmed release), so later messages of
// their priority do not overtake them; confirmed messages of the same batch
// are not withdrawn. A failure that ends during a pause is part of the
// outage that began it: it neither doubles the backoff nor lengthens the
// pause.
func (s *Scheduler) finish(res releaseResult) {
	s.inflight -= res.n
	if res.last {
		s.calls--
		delete(s.unanswered, res.seq)
	}
	s.prog.released += int64(res.acked)
	s.withdrawn.forget(res.del)
	s.withdrawn.forget(res.retry)
	s.answeredForExchangeDeletes(res)
	for _, k := range res.gone {
		delete(s.outstanding, k)
	}
	s.queueDelete(res.del)
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
	if s.clock.Now().Before(s.holdUntil) {
		// Releases are already held for a failure of the same outage
		// (batches in flight together fail together when a connection is
		// lost under them): one failure, one step of the backoff.
		return
	}
	s.holdUntil = s.clock.Now().Add(s.backoff)
	s.holdNs.Store(s.holdUntil.UnixNano())
	if res.err == nil {
		s.log.Warn("scheduler: releases not confirmed, retrying", "messages", len(res.retry), "backoff", s.backoff)
	}
	s.backoff = min(2*s.backoff, s.opts.RetryBackoffMax)
}
