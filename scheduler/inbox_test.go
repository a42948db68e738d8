package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

func TestCancelled(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second})
	h.start()
	ctx := context.Background()
	a, b := h.put("a", 10, 0), h.put("b", 10, 0)
	c := h.put("c", 5_000, 0) // on disk only
	h.put("keep", 10, 0)
	h.settle()
	for _, m := range []*store.Message{a, c} {
		if ok, err := h.st.CancelKey(ctx, m.Key); err != nil || !ok {
			t.Fatalf("CancelKey: %v %v", ok, err)
		}
		h.s.Cancelled(m.Key)
	}
	// b is cancelled in the store, but the scheduler is never told (as when
	// its inbox is full): it must still not be released.
	if ok, err := h.st.CancelKey(ctx, b.Key); err != nil || !ok {
		t.Fatalf("CancelKey: %v %v", ok, err)
	}
	if snap := h.settle(); snap.loaded != 2 {
		t.Fatalf("wheel holds %d keys, want 2 (b and keep)", snap.loaded)
	}
	h.advance(10 * time.Second)
	h.wantReleased("keep")
}

func TestAddedRacesLoader(t *testing.T) {
	// Publishers store and announce messages while the clock moves and the
	// loader scans the range they fall in, so a message can reach the
	// wheel both from a scan and from Added: each is released exactly once.
	h := newHarness(t, Options{Horizon: 20 * time.Millisecond})
	h.start()
	const publishers, each = 4, 100
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				m := &store.Message{
					VHost: "/", Exchange: "dx", Body: []byte("x"), Due: t0 + 100 + int64(i*7%50),
					Delay: 100, Priority: uint8(i % 3), MessageID: fmt.Sprintf("p%d-%03d", p, i), Incarnation: h.incarnation(),
				}
				if err := h.st.Put(context.Background(), m); err != nil {
					t.Error(err)
					return
				}
				h.s.Added(m)
				if i%2 == 0 {
					h.clk.Advance(time.Millisecond) // 200 ms in all, in 1 ms steps
				}
			}
		})
	}
	wg.Wait()
	h.advance(time.Second)
	got := h.rel.released()
	if len(got) != publishers*each {
		t.Fatalf("released %d, want %d", len(got), publishers*each)
	}
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			t.Fatalf("%s released twice", id)
		}
		seen[id] = true
	}
}

func TestLateAddedIsNotDuplicated(t *testing.T) {
	// The slow side of the race above, made deterministic: a publisher's
	// Added arrives after the loader already read the message from disk,
	// after it went out for release, and after it was deleted.
	h := newHarness(t, Options{Horizon: 100 * time.Millisecond})
	h.start()
	h.settle()
	var msgs []*store.Message
	for i := range 6 {
		m := &store.Message{VHost: "/", Exchange: "dx", Body: []byte("x"), Due: t0 + 150 + int64(i), Delay: 150, MessageID: fmt.Sprint(i), Incarnation: h.incarnation()}
		if err := h.st.Put(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m) // not announced yet
	}
	if snap := h.advance(60 * time.Millisecond); snap.loaded != 6 {
		t.Fatalf("loader took %d keys, want 6", snap.loaded)
	}
	h.s.Added(msgs...) // already in the wheel
	if snap := h.settle(); snap.loaded != 6 {
		t.Fatalf("wheel holds %d keys after a late Added, want 6", snap.loaded)
	}
	// Out for release: announce them again while Release blocks.
	h.rel.mu.Lock()
	h.rel.block = make(chan struct{})
	h.rel.entered = make(chan struct{}, 10)
	h.rel.mu.Unlock()
	h.clk.Advance(100 * time.Millisecond) // all due
	select {
	case <-h.rel.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("release did not start")
	}
	h.s.Added(msgs...)
	close(h.rel.block)
	snap := h.settle()
	if snap.loaded != 0 {
		t.Fatalf("wheel holds %d keys after release, want 0", snap.loaded)
	}
	// Deleted: announce them once more; the store no longer has them.
	h.s.Added(msgs...)
	h.advance(time.Second)
	got := h.rel.released()
	if len(got) != 6 {
		t.Fatalf("released %v, want each of 6 once", got)
	}
}

func TestInboxOverflowFallsBackToDisk(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second})
	h.start()
	h.settle()
	h.s.mu.Lock()
	h.s.maxInbox = 2 // the loop cannot take them before the third arrives
	h.s.mu.Unlock()
	var msgs []*store.Message
	for i := range 10 {
		m := &store.Message{VHost: "/", Exchange: "dx", Body: []byte("x"), Due: t0 + 500 - int64(i), Delay: 500, MessageID: fmt.Sprint(i), Incarnation: h.incarnation()}
		msgs = append(msgs, m)
	}
	if err := h.st.Put(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	h.s.Added(msgs...)
	h.advance(time.Second)
	if got := h.rel.released(); len(got) != 10 {
		t.Fatalf("released %v, want all 10", got)
	}
}

// TestAnnouncedAndRescan: a key another node stored below the cursor
// reaches the wheel when announced, or at a rescan (asked for, or
// periodic), and is never released otherwise.
func TestAnnouncedAndRescan(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rescan time.Duration // Options.Rescan
		tell   func(h *harness, k store.Key)
		want   []string
	}{
		{"announced", 0, func(h *harness, k store.Key) { h.s.Announced(k) }, []string{"remote"}},
		{"rescan asked for", 0, func(h *harness, k store.Key) { h.s.Rescan() }, []string{"remote"}},
		{"periodic rescan", 2 * time.Second, func(*harness, store.Key) {}, []string{"remote"}},
		{"neither: on disk only, below the cursor", 0, func(*harness, store.Key) {}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{Horizon: time.Minute, Rescan: tc.rescan})
			h.start()
			h.put("local", 5_000, 0)
			h.settle() // the horizon is loaded: the cursor is a minute ahead
			m := &store.Message{VHost: "/", Exchange: "dx", Body: []byte("remote"), Due: t0 + 4_000,
				Delay: 4_000, MessageID: "remote", Incarnation: h.incarnation()}
			if err := h.st.Put(context.Background(), m); err != nil { // as another node: no Added
				t.Fatal(err)
			}
			tc.tell(h, m.Key)
			h.settle()
			h.advance(3 * time.Second)
			h.advance(3 * time.Second)
			h.wantReleased(append(tc.want, "local")...)
		})
	}
}
