package scheduler

import (
	"sync"
	"time"
)

// Clock is the scheduler's source of wall-clock time and its one timer.
// Due times are wall-clock unix milliseconds, so Now must be the wall clock.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a resettable one-shot timer, like *time.Timer.
type Timer interface {
	// C delivers the time when the timer fires.
	C() <-chan time.Time
	// ResetAt stops the timer and arms it to fire when the clock reaches
	// t; a value from an earlier arming is no longer received after
	// ResetAt returns. An absolute time, so that a clock moving between
	// the caller's reading of it and the arming cannot delay the wake-up.
	ResetAt(t time.Time)
	// Stop stops the timer for good and releases what it holds; the
	// owner calls it once it no longer waits on C.
	Stop()
}

// RealClock is the system clock.
type RealClock struct{}

// Now is time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer returns a timer that fires d from now, on the monotonic clock,
// as time.Timer does: on Linux a timerfdTimer, which fires within the
// kernel's timer slack rather than up to a millisecond late, and on time
// while the runtime's run queues are busy.
func (RealClock) NewTimer(d time.Duration) Timer { return newRealTimer(d) }

// goTimer is a time.Timer as a Timer.
type goTimer struct{ t *time.Timer }

func (g goTimer) C() <-chan time.Time { return g.t.C }
func (g goTimer) ResetAt(t time.Time) { g.t.Reset(time.Until(t)) } // Go 1.23+: no stale value after Reset
func (g goTimer) Stop()               { g.t.Stop() }

// ManualClock is a Clock that moves only when told to, for tests and
// benchmarks. Its timers fire when Advance or Set moves the time to or past
// their deadline.
type ManualClock struct {
	mu     sync.Mutex // guards now and timers
	now    time.Time
	timers []*manualTimer
}

// NewManualClock returns a ManualClock reading t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and fires the timers that are due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(c.now.Add(d))
}

// Set moves the clock to t, backwards too (a wall-clock jump), and fires the
// timers that are due.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(t)
}

func (c *ManualClock) setLocked(t time.Time) {
	c.now = t
	for _, tm := range c.timers {
		tm.fireIfDue(t)
	}
}

// NewTimer returns a timer that fires once the clock reaches Now()+d.
func (c *ManualClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := &manualTimer{c: c, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, tm)
	tm.armLocked(c.now.Add(d))
	return tm
}

// manualTimer is a ManualClock's timer; its fields are guarded by c.mu.
type manualTimer struct {
	c        *ManualClock
	ch       chan time.Time
	deadline time.Time
	armed    bool
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

func (t *manualTimer) ResetAt(at time.Time) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.armLocked(at)
}

func (t *manualTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.armed = false
	t.drain()
}

func (t *manualTimer) armLocked(at time.Time) {
	t.drain()
	t.deadline = at
	t.armed = true
	t.fireIfDue(t.c.now)
}

func (t *manualTimer) fireIfDue(now time.Time) {
	if t.armed && !now.Before(t.deadline) {
		t.armed = false
		select {
		case t.ch <- now:
		default:
		}
	}
}

func (t *manualTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}
