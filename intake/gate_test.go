package intake

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }

const target = 5 * time.Millisecond

// TestGateWindow drives a Gate through releases late and on time, with
// used messages in Puts, and checks the window after each step.
func TestGateWindow(t *testing.T) {
	tests := []struct {
		name string
		used int
		step func(g *Gate, c *fakeClock)
		want int
	}{
		{name: "open before any release", used: 5000, step: func(*Gate, *fakeClock) {}, want: MaxWindow},
		{name: "on time keeps it open", used: 5000, step: func(g *Gate, _ *fakeClock) { g.Observe(target) }, want: MaxWindow},
		{name: "just past the target halves what is in Puts", used: 1000, step: func(g *Gate, _ *fakeClock) { g.Observe(target + 1) }, want: 499},
		{name: "four times the target cuts to an eighth", used: 1000, step: func(g *Gate, _ *fakeClock) { g.Observe(4 * target) }, want: 125},
		{name: "never below MinWindow", used: 3, step: func(g *Gate, _ *fakeClock) { g.Observe(time.Hour) }, want: MinWindow},
		{name: "one cut per CutEvery", used: 1000, step: func(g *Gate, c *fakeClock) {
			g.Observe(2 * target)
			c.add(CutEvery - time.Millisecond)
			g.Observe(2 * target)
		}, want: 250},
		{name: "cuts again after CutEvery", used: 1000, step: func(g *Gate, c *fakeClock) {
			g.Observe(2 * target)
			c.add(CutEvery)
			g.Observe(2 * target)
		}, want: 62},
		{name: "a window of releases on time widens it by one", used: 1000, step: func(g *Gate, _ *fakeClock) {
			g.Observe(2 * target) // 250
			for range 250 + 251 {
				g.Observe(0)
			}
		}, want: 252},
		{name: "opens when no release came for IdleAfter", used: 1000, step: func(g *Gate, c *fakeClock) {
			g.Observe(time.Second)
			c.add(IdleAfter)
		}, want: MaxWindow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
			g := New(target, c.now)
			if n, err := g.Acquire(context.Background(), tt.used); err != nil || n != tt.used {
				t.Fatalf("Acquire(%d) on an open gate = %d, %v", tt.used, n, err)
			}
			tt.step(g, c)
			if got := g.Window(); got != tt.want {
				t.Fatalf("window %d, want %d", got, tt.want)
			}
		})
	}
}

// TestGateAcquireWaitsForRoom: with the window full, Acquire waits until a
// Release makes room and grants no more than the room; a cancelled wait
// returns the context's error and grants nothing.
func TestGateAcquireWaitsForRoom(t *testing.T) {
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	g := New(target, c.now)
	if n, _ := g.Acquire(context.Background(), 40); n != 40 {
		t.Fatalf("granted %d of 40 on an open gate", n)
	}
	g.Observe(2 * target) // window 10, with 40 in Puts
	got := make(chan int)
	go func() {
		n, err := g.Acquire(context.Background(), 100)
		if err != nil {
			t.Error(err)
		}
		got <- n
	}()
	g.Release(20) // 20 in Puts: still full
	select {
	case n := <-got:
		t.Fatalf("Acquire granted %d with the window full", n)
	case <-time.After(50 * time.Millisecond):
	}
	g.Release(15) // 5 in Puts: room for 5
	if n := <-got; n != 5 {
		t.Fatalf("granted %d, want the 5 the window had room for", n)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := g.Acquire(ctx, 1); err == nil || n != 0 {
		t.Fatalf("Acquire with the window full and ctx done = %d, %v", n, err)
	}
}
