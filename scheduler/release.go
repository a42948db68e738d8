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
// publishLoop skips keys that are gone (cancelled), collects stale ones
// (exchange deleted or re-created: deleted, never released) and hands the
// rest to the Releaser; confirmLoop awaits the confirms. A plain (not pipelined) Releaser gets one goroutine per Release
// call, at most MaxInFlight/BatchSize at once. The loop then queues
// confirmed and stale keys for their delete (delete.go) and puts
// unconfirmed ones back into the wheel.
//
// A batch refused before it was written (its read failed, or the
// PipelinedReleaser refused it) must not be overtaken by the batches
// dispatched after it, which are due no earlier. publishLoop counts the
// batches it refused, and the loop those it took back; a batch dispatched
// while the loop had not taken back every one publishLoop has refused by
// the time it reaches the batch is refused in turn, unread by the
// Releaser, and all of them go back into the wheel together, in release
// order. (A batch written and then not confirmed is beyond recall: the
// Releaser keeps its own later batches from overtaking it.)

// batchJob is a dispatched batch: the keys to release, in order.
type batchJob struct {
	seq  uint64 // numbers the batches in dispatch order
	keys []store.Key
	// refusalsIn is how many refused batches the loop had taken back when
	// it dispatched this one.
	refusalsIn uint64
}

// releaseResult is what the pipeline reports to the loop for one batch.
type releaseResult struct {
	seq   uint64      // the batch's batchJob.seq
	del   []store.Key // confirmed or stale: delete them
	retry []store.Key // not confirmed: back into the wheel
	gone  []store.Key // no longer in the store (cancelled)
	n     int         // messages the batch held
	acked int         // confirmed by RabbitMQ (in del)
	err   error       // reading the store failed; every key is in retry
	// refused: some keys in retry were never written (the read failed,
	// the Releaser refused them, or an earlier refusal was not taken back
	// when this batch was dispatched).
	refused bool
	// releasedInc holds the exchange incarnation of each message RabbitMQ
	// confirmed, for the exchange deletes' count (exchange.go).
	releasedInc []uint64
}

// dispatch hands due keys to the release pipeline while limits allow: at
// most BatchSize per batch, MaxInFlight in flight, and within Rate (a token
// bucket holding 100 ms of the rate).
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
		s.batchSeq++
		s.unanswered[s.batchSeq] = struct{}{}
		s.jobs <- batchJob{seq: s.batchSeq, keys: batch, refusalsIn: s.refusalsIn} // never blocks: it holds maxCalls
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
// takes dispatched batches in dispatch order, as read from the store by
// fetchLoop, drops what is gone or stale and hands the rest to the
// Releaser. It does not wait for confirms (confirmLoop does), so batches
// go out one after another, in order, with one hand-off between the loop
// and the wire.
func (s *Scheduler) publishLoop(ctx context.Context, jobs <-chan batchJob, waits chan<- published) {
	defer close(waits)
	publish := s.publishFunc()
	fetched := make(chan *fetch, s.maxCalls) // every batch in flight fits
	s.wg.Go(func() { s.fetchLoop(jobs, s.reads, fetched) })
	var refusals uint64 // batches refused so far
	for f := range fetched {
		<-f.done
		keys := f.job.keys
		res := releaseResult{seq: f.job.seq, n: len(keys)}
		if f.err != nil || f.job.refusalsIn < refusals {
			// Unread, or dispatched before an earlier refusal was
			// taken back: it must not overtake that one.
			res.err, res.retry, res.refused = f.err, keys, true
			refusals++
			s.results <- res
			continue
		}
		live := make([]*store.Message, 0, len(f.msgs))
		for i, m := range f.msgs {
			switch {
			case m == nil:
				res.gone = append(res.gone, keys[i])
			case s.st.Stale(m):
				res.del = append(res.del, keys[i])
			default:
				live = append(live, m)
			}
		}
		if len(live) == 0 {
			s.results <- res
			continue
		}
		wait, refused := publish(ctx, live)
		// A PipelinedReleaser has written the batch by now (but what it
		// refused); a plain Releaser has only been started.
		if refused {
			res.refused = true
			refusals++
		}
		waits <- published{res: res, live: live, at: s.clock.Now(), wait: wait}
	}
}

// maxGets is how many store reads of dispatched batches run at once. A
// store whose Get is a round trip to a database (pgstore) would otherwise
// bound release to one batch per round trip; the batches are small when
// release keeps up (what fell due since the last turn). A message
// cancelled after its read is published anyway, as one cancelled while it
// was being published.
const maxGets = 4

// fetch is one dispatched batch, or one read ahead, being read from the
// store.
type fetch struct {
	job  batchJob // zero for a read ahead
	msgs []*store.Message
	err  error
	done chan struct{} // closed once msgs and err are set
}

// fetchLoop starts the store read of each dispatched batch as it comes,
// maxGets at once, and hands them on in dispatch order, never waiting for
// publishLoop. It also reads ahead (readahead.go): a batch takes what was
// read ahead for its keys and reads only the rest.
func (s *Scheduler) fetchLoop(jobs <-chan batchJob, reads <-chan []store.Key, fetched chan<- *fetch) {
	defer close(fetched)
	gets := make(chan struct{}, maxGets)
	ahead := &readsAhead{byKey: map[store.Key]aheadRead{}}
	for {
		select {
		case keys := <-reads:
			s.startReadAhead(ahead, keys, gets)
		case job, ok := <-jobs:
			if !ok {
				return
			}
			f := &fetch{job: job, done: make(chan struct{})}
			if got, any := ahead.take(job.keys); any {
				s.wg.Go(func() {
					f.msgs, f.err = s.readRest(job.keys, got, gets)
					close(f.done)
				})
			} else {
				s.startGet(f, job.keys, gets, nil)
			}
			fetched <- f // never blocks: it holds every batch in flight
		}
	}
}

// startGet reads keys into f in a goroutine of its own, once one of the
// maxGets places in gets is free, closes f.done and then calls after (if
// not nil).
func (s *Scheduler) startGet(f *fetch, keys []store.Key, gets chan struct{}, after func()) {
	gets <- struct{}{}
	s.wg.Go(func() {
		f.msgs, f.err = s.st.Get(keys)
		<-gets
		close(f.done)
		if after != nil {
			after()
		}
	})
}

// published is a batch handed to the Releaser, awaiting its confirms.
type published struct {
	res  releaseResult
	live []*store.Message
	at   time.Time // when Publish returned
	wait func() (confirmed []bool)
}

// confirmLoop is the release pipeline's second stage, one goroutine: it
// awaits the confirms of each published batch, in order, counts them and
// reports the result to the loop.
func (s *Scheduler) confirmLoop(waits <-chan published) {
	for p := range waits {
		confirmed := p.wait()
		res := p.res
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
		res.acked = released
		if released > 0 && s.opts.Metrics != nil {
			s.opts.Metrics.Released(released)
		}
		s.results <- res
	}
}

// publishFunc is how publishLoop hands a batch over: a PipelinedReleaser's
// Publish, or a plain Release call started in a goroutine of its own, so
// that up to MaxInFlight/BatchSize calls overlap and start in order.
func (s *Scheduler) publishFunc() func(ctx context.Context, batch []*store.Message) (wait func() []bool, refused bool) {
	if pr, ok := s.r.(PipelinedReleaser); ok {
		return pr.Publish
	}
	return func(ctx context.Context, batch []*store.Message) (func() []bool, bool) {
		done := make(chan []bool, 1)
		s.wg.Go(func() { done <- s.r.Release(ctx, batch) })
		return func() []bool { return <-done }, false
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
	s.calls--
	s.prog.released += int64(res.acked)
	delete(s.unanswered, res.seq)
	if res.refused {
		s.refusalsIn++ // its keys are back in the wheel below, before any dispatch
	}
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
	if res.err == nil {
		s.log.Warn("scheduler: releases not confirmed, retrying", "messages", len(res.retry), "backoff", s.backoff)
	}
	s.backoff = min(2*s.backoff, s.opts.RetryBackoffMax)
}
