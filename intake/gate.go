package intake

import (
	"context"
	"sync"
	"time"
)

const (
	// MinWindow is the least number of messages the window lets into Puts
	// at once.
	MinWindow = 1
	// MaxWindow is the open window: no storer waits for room before it.
	MaxWindow = 1 << 20
	// CutEvery is the least time between two cuts: a cut shows in the
	// releases' lateness only a few ms on, once the Puts already in flight
	// are done.
	CutEvery = 10 * time.Millisecond
	// IdleAfter opens the window when no release was observed for it.
	IdleAfter = 100 * time.Millisecond
)

// Gate is the intake window; see the package doc. Its methods are safe for
// concurrent use.
type Gate struct {
	target time.Duration
	now    func() time.Time

	mu      sync.Mutex // guards the fields below
	window  int        // messages that may be in Puts at once
	used    int        // messages granted and not yet released
	onTime  int        // releases on time since the window last widened
	cutAt   time.Time  // the last cut
	seenAt  time.Time  // the last Observe
	waiting chan struct{}
	// waiting, when not nil, is closed (and cleared) by the next Release
	// or widening: Acquire waits on it for room.
}

// New returns an open Gate that cuts its window whenever a release is
// written more than target after its due time. now is the clock; nil is
// time.Now.
func New(target time.Duration, now func() time.Time) *Gate {
	if now == nil {
		now = time.Now
	}
	return &Gate{target: target, now: now, window: MaxWindow}
}

// Observe takes the lateness of one confirmed release: from its due time
// to its being written to RabbitMQ.
func (g *Gate) Observe(late time.Duration) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openIfIdleLocked(now)
	g.seenAt = now
	if late <= g.target {
		// One message more per window's worth of releases on time.
		if g.window < MaxWindow {
			if g.onTime++; g.onTime >= g.window {
				g.onTime = 0
				g.window++
				g.wakeLocked()
			}
		}
		return
	}
	if now.Sub(g.cutAt) < CutEvery {
		return
	}
	g.cutAt = now
	// The later the release, the deeper the cut: by half just past the
	// target, by a further target/late beyond it.
	in := int64(min(g.window, g.used))
	g.window = max(MinWindow, int(in*int64(g.target)/int64(2*late)))
}

// Acquire waits until the window has room, then grants room for up to want
// messages (at least one) and returns how many. It returns 0 and ctx's
// error if ctx ends first.
func (g *Gate) Acquire(ctx context.Context, want int) (int, error) {
	for {
		g.mu.Lock()
		g.openIfIdleLocked(g.now())
		if room := g.window - g.used; room > 0 {
			n := min(max(want, 1), room)
			g.used += n
			g.mu.Unlock()
			return n, nil
		}
		if g.waiting == nil {
			g.waiting = make(chan struct{})
		}
		wait := g.waiting
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Release gives back room for n messages granted by Acquire.
func (g *Gate) Release(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.used -= n
	g.wakeLocked()
}

// Window is the number of messages the window lets into Puts at once now.
func (g *Gate) Window() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.openIfIdleLocked(g.now())
	return g.window
}

// openIfIdleLocked opens the window when no release was observed for
// IdleAfter; g.mu is held.
func (g *Gate) openIfIdleLocked(now time.Time) {
	if g.window < MaxWindow && now.Sub(g.seenAt) >= IdleAfter {
		g.window, g.onTime = MaxWindow, 0
		g.wakeLocked()
	}
}

// wakeLocked wakes every Acquire waiting for room; g.mu is held.
func (g *Gate) wakeLocked() {
	if g.waiting != nil {
		close(g.waiting)
		g.waiting = nil
	}
}
