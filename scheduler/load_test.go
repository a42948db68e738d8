package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// putBacklog stores n messages due at pseudo-random times over the span ms
// before now, with priorities 0-9, as if they fell due while the proxy was
// down, then restarts the store (closes and reopens it).
func (h *harness) putBacklog(n int, span int64) []*store.Message {
	h.t.Helper()
	r := rand.New(rand.NewPCG(uint64(n), uint64(span)))
	msgs := make([]*store.Message, n)
	for i := range msgs {
		msgs[i] = h.put(fmt.Sprintf("m%04d", i), -1-r.Int64N(span), uint8(r.IntN(10)))
	}
	if err := h.st.Close(); err != nil {
		h.t.Fatal(err)
	}
	h.open()
	return msgs
}

func TestBacklogAfterDowntimeDrainsByPriority(t *testing.T) {
	// The loader reads a backlog from its oldest key in windows of one
	// horizon, doubling; each backlog here is within the first window, so
	// the whole of it is loaded before the first release.
	tests := []struct {
		name string
		opts Options
		n    int
		down int64 // ms
	}{
		{"down 30 s, small batches", Options{BatchSize: 3}, 40, 30_000},
		{"down 50 s", Options{}, 3000, 50_000},
		{"down 1 s, one batch", Options{}, 200, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.opts)
			msgs := h.putBacklog(tc.n, tc.down)
			h.start()
			h.settle()
			h.wantReleased(inReleaseOrder(msgs...)...)
			for _, b := range h.rel.batches {
				if len(b) > h.s.opts.BatchSize {
					t.Fatalf("batch of %d with BatchSize %d", len(b), h.s.opts.BatchSize)
				}
			}
			if n := h.st.Pending(); n != 0 {
				t.Fatalf("store holds %d after the drain", n)
			}
		})
	}
}

func TestRateLimitedBacklogDrainsByPriority(t *testing.T) {
	// At 20/s (a bucket of 2 every 100 ms) the loader has loaded all of a
	// backlog long before most of it is released, and it goes out by
	// priority, then due. After a downtime longer than the horizon, the
	// first bucket goes before the loader has read past the oldest window:
	// it is the best of that window.
	tests := []struct {
		name   string
		down   int64 // ms
		oldest bool  // two messages in the oldest window, alone
	}{
		{"down 30 s", 30_000, false},
		{"down 10 h", 36_000_000, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{Rate: 20})
			var first []*store.Message
			rest := 30
			if tc.oldest {
				first = []*store.Message{h.put("old-p0", -tc.down, 0), h.put("old-p1", -tc.down+1, 1)}
				rest -= len(first)
			}
			msgs := h.putBacklog(rest, min(tc.down, 9*3_600_000))
			h.start()
			h.settle()
			want := append(inReleaseOrder(first...), inReleaseOrder(msgs...)...)
			for i := 2; i < len(want); i += 2 {
				h.wantReleased(want[:i]...)
				h.advance(100 * time.Millisecond)
			}
			h.wantReleased(want...)
		})
	}
}

// scanLog is the real store, recording the ranges the loader asks for.
type scanLog struct {
	*boltstore.Store
	mu     sync.Mutex // guards ranges
	ranges [][2]int64
}

func (l *scanLog) ScanKeys(from, until int64, fn func(store.Key) error) error {
	l.mu.Lock()
	l.ranges = append(l.ranges, [2]int64{from - t0, until - t0})
	l.mu.Unlock()
	return l.Store.ScanKeys(from, until, fn)
}

func TestBacklogLoadsInGrowingWindows(t *testing.T) {
	// After ten hours down, the loader starts at the first stored key and
	// asks for a short stretch first (the store sorts what it is asked for
	// before it answers), then doubles: the first release does not wait
	// for the whole backlog.
	h := newHarness(t, Options{Horizon: time.Second})
	var want []string
	for i := range 50 {
		id := fmt.Sprintf("m%02d", i)
		h.put(id, -10*3_600_000+int64(i)*720_000, 0) // every 12 min over 10 h
		want = append(want, id)
	}
	log := &scanLog{Store: h.st}
	h.backend = log
	h.start()
	h.settle()
	h.wantReleased(want...)
	log.mu.Lock()
	defer log.mu.Unlock()
	first := log.ranges[0]
	if first[0] != -10*3_600_000 || first[1]-first[0] > 1000 {
		t.Fatalf("first scan %v ms, want one second from the first key at -36000000", first)
	}
	if n := len(log.ranges); n > 30 {
		t.Fatalf("%d scans for a 10 h backlog: the window does not grow", n)
	}
}

func TestHorizonLoadsLater(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second})
	for i := range 100 {
		h.put(fmt.Sprintf("m%03d", i), int64(i)*100, 0) // over 10 s
	}
	h.start()
	snap := h.settle()
	if snap.loaded > 11 || snap.cursor > t0+1000 {
		t.Fatalf("holds %d keys, loaded up to %+d ms, with a 1 s horizon", snap.loaded, snap.cursor-t0)
	}
	for range 100 {
		snap = h.advance(100 * time.Millisecond)
		if snap.loaded > 11 {
			t.Fatalf("holds %d keys with a 1 s horizon", snap.loaded)
		}
	}
	if got := h.rel.released(); len(got) != 100 {
		t.Fatalf("released %d of 100", len(got))
	}
}

func TestMaxLoadedBoundsMemory(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second, MaxLoaded: 10})
	for i := range 50 {
		h.put(fmt.Sprintf("s%02d", i), 500+int64(i), 0)
	}
	h.start()
	if snap := h.settle(); snap.loaded > 10 {
		t.Fatalf("holds %d keys with MaxLoaded 10", snap.loaded)
	}
	// Added keys earlier than those held push the latest back to disk.
	for i := range 5 {
		h.put(fmt.Sprintf("a%d", i), 400, 0)
	}
	if snap := h.settle(); snap.loaded > 10 {
		t.Fatalf("holds %d keys with MaxLoaded 10", snap.loaded)
	}
	h.advance(2 * time.Second)
	got := h.rel.released()
	want := []string{"a0", "a1", "a2", "a3", "a4"}
	for i := range 50 {
		want = append(want, fmt.Sprintf("s%02d", i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("released %v\nwant %v", got, want)
	}
}
