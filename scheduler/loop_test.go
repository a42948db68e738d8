package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

func TestWallClockJumps(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second})
	h.start()
	h.put("a", 100, 0)
	h.put("b", 3_000_000, 0) // 50 min
	h.advance(50 * time.Millisecond)
	// Back an hour: nothing is released early.
	h.clk.Set(base.Add(-time.Hour))
	h.settle()
	h.clk.Set(base.Add(99 * time.Millisecond))
	h.settle()
	h.wantReleased()
	h.advance(time.Millisecond)
	h.wantReleased("a")
	// Forward an hour: the overdue message drains.
	h.clk.Set(base.Add(time.Hour))
	h.settle()
	h.wantReleased("a", "b")
}

func TestStoreClosedEndsRun(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second})
	h.start()
	h.settle()
	if err := h.st.Close(); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(time.Second) // the loader's next scan fails
	select {
	case err := <-h.done:
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Run = %v, want store.ErrClosed", err)
		}
		h.stop()
		h.stop = nil
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the store closed")
	}
}

func TestShutdownWaitsForReleases(t *testing.T) {
	h := newHarness(t, Options{})
	h.rel.block = make(chan struct{})
	h.rel.entered = make(chan struct{}, 1)
	m := h.put("m", 0, 0)
	h.start()
	select {
	case <-h.rel.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("release did not start")
	}
	h.halt() // ctx ends: Release returns unconfirmed, Run returns after it
	if got := h.stored(m); !got[0] {
		t.Fatal("an unconfirmed message was deleted at shutdown")
	}
	if err := h.s.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
}
