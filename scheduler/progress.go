package scheduler

import (
	"math"
	"sync/atomic"
	"time"
)

// Progress on long work. Once a second (progressSample) the loop measures
// the backlog: the messages due by now and not yet released. They are
//
//   - waiting in the wheel: its due entries, after moving every entry due by
//     now into them, as ExpireN does when it is behind (each key once, so
//     the cost per release stays O(1));
//   - in flight: handed to the Releaser, not yet answered;
//   - waiting on disk, not loaded yet (after a downtime, or beyond
//     MaxLoaded): the stored messages due by now (Store.Upcoming, which
//     counts by due minute: up to the end of the current minute) less those
//     held; asked only while the loader's cursor is behind now.
//
// The count and the due time of the oldest waiting message are published
// for Overdue (the gauges). When the oldest waiting message is progressLate
// late, releases are behind: a line is logged then, one every
// progressEvery with what was released since, what remains, the rate of
// the last interval and the time left at that rate, and one line when
// caught up (nothing waits, or nothing waits longer than progressCaughtUp).

const (
	progressSample   = time.Second     // how often the loop measures the backlog
	progressLate     = 5 * time.Second // behind: the oldest waiting message is this late
	progressCaughtUp = time.Second     // caught up: nothing waits longer than this
	progressEvery    = 5 * time.Second // a progress line this often while behind
)

// progress is the scheduler's measure of its backlog.
type progress struct {
	overdue atomic.Int64 // at the last sample: due and not yet released
	oldest  atomic.Int64 // at the last sample: due time (unix ms) of the oldest waiting message; 0 when none waits

	// Owned by the loop.
	released   int64 // releases RabbitMQ confirmed, counted as the loop takes their results
	nextSample time.Time
	behind     bool      // between a "behind" line and the "caught up" one
	since      time.Time // when releases fell behind
	sinceRel   int64     // released then
	lastLog    time.Time // the last progress line
	lastRel    int64     // released then
}

// Overdue is the backlog at the last measure (at most about a second old):
// the messages due and not yet released (waiting, loaded or on disk, or in
// flight), and how late the oldest waiting one is now (0 when none waits).
// Safe for concurrent use; before Run both are 0.
func (s *Scheduler) Overdue() (messages int64, oldest time.Duration) {
	messages = s.prog.overdue.Load()
	if due := s.prog.oldest.Load(); due > 0 {
		oldest = max(s.clock.Now().Sub(time.UnixMilli(due)), 0)
	}
	return messages, oldest
}

// sampleProgress measures the backlog once per progressSample and logs the
// progress lines; the loop calls it every turn, after dispatch.
func (s *Scheduler) sampleProgress(now time.Time) {
	p := &s.prog
	if now.Before(p.nextSample) {
		return
	}
	p.nextSample = now.Add(progressSample)
	waiting, oldest := s.waiting(now)
	overdue := waiting + int64(s.inflight)
	p.overdue.Store(overdue)
	p.oldest.Store(oldest)
	released := p.released
	var late time.Duration
	if waiting > 0 {
		late = now.Sub(time.UnixMilli(oldest))
	}

	switch {
	case !p.behind && waiting > 0 && late >= progressLate:
		p.behind, p.since, p.sinceRel = true, now, released
		p.lastLog, p.lastRel = now, released
		s.log.Info("scheduler: releases behind, catching up",
			"overdue", overdue, "oldest_late", late.Round(time.Millisecond))
	case p.behind && (waiting == 0 || late < progressCaughtUp):
		p.behind = false
		s.log.Info("scheduler: releases caught up",
			"released", released-p.sinceRel, "took", now.Sub(p.since).Round(time.Millisecond))
	case p.behind && now.Sub(p.lastLog) >= progressEvery:
		rate := float64(released-p.lastRel) / now.Sub(p.lastLog).Seconds()
		attrs := []any{
			"released", released - p.sinceRel, "remaining", overdue,
			"rate_per_s", math.Round(rate*10) / 10,
			"oldest_late", late.Round(time.Millisecond),
		}
		if rate > 0 { // else nothing was released: no estimate
			attrs = append(attrs, "eta", time.Duration(float64(overdue)/rate*float64(time.Second)).Round(time.Second))
		}
		p.lastLog, p.lastRel = now, released
		s.log.Info("scheduler: releases catching up", attrs...)
	}
}

// waiting counts the messages due by now that wait for release, loaded or
// on disk, and the due time of the oldest of them (0 when none waits).
func (s *Scheduler) waiting(now time.Time) (n, oldest int64) {
	nowMs := now.UnixMilli()
	// Entries due but still in slots (dispatch was held back) move among
	// the due ones, as ExpireN would move them, so that they are counted.
	s.w.spillDue(nowMs)
	if s.w.due.n > 0 {
		if first := s.w.due.first(); first <= nowMs {
			n, oldest = int64(s.w.due.n), first
		}
	}
	c := s.cursor.Due()
	if c > nowMs {
		return n, oldest // everything due is loaded
	}
	// The loader is behind: every key held (in the wheel, in flight or
	// awaiting its delete) is below the cursor, so due by now, and every
	// stored key below the cursor is held. The messages due on disk are
	// the stored ones due by now less those held. The store counts by due
	// minute: up to the end of this one, so the count also takes in the
	// messages due later this minute.
	end := (nowMs/60_000 + 1) * 60_000
	stored := s.st.Upcoming([]int64{end})[0]
	if onDisk := stored - int64(s.w.Len()+len(s.outstanding)); onDisk > 0 {
		// The oldest on disk is due at the cursor at the earliest, and
		// no earlier than the first stored message: before the first
		// scan the cursor is at the start of time.
		first := c
		if due, ok := s.st.NextDue(); ok {
			first = max(first, due)
		}
		if first > nowMs {
			return n, oldest // nothing on disk is due yet
		}
		n += onDisk
		if oldest == 0 || first < oldest {
			oldest = first
		}
	}
	return n, oldest
}
