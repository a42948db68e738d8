package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testwait"
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

// heldScans is a store whose scans, after the first, read the store and
// then wait for release before they answer: a slow database.
type heldScans struct {
	Store
	scans   atomic.Int32
	started chan struct{} // a value as each held scan has read the store
	release chan struct{} // closed to let the held scans answer
}

func (h *heldScans) ScanKeys(from, until int64, fn func(store.Key) error) error {
	if h.scans.Add(1) == 1 {
		return h.Store.ScanKeys(from, until, fn)
	}
	var keys []store.Key
	err := h.Store.ScanKeys(from, until, func(k store.Key) error {
		keys = append(keys, k)
		return nil
	})
	h.started <- struct{}{}
	<-h.release
	for _, k := range keys {
		if err := fn(k); err != nil {
			return nil // store.ErrStop
		}
	}
	return err
}

// While a scan is under way, the loop goes on releasing what is due, and a
// message Added meanwhile in the scanned range (stored after the scan read
// the store) still goes into the wheel and is released on time.
func TestReleasesGoOnWhileAScanIsUnderWay(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Second})
	held := &heldScans{Store: h.st, started: make(chan struct{}, 1), release: make(chan struct{})}
	h.backend = held
	h.put("a@100", 100, 0)
	h.put("b@700", 700, 0)
	h.put("far@1500", 1500, 0)
	h.start()
	h.settle() // the first load, in the loop: [+100, +1000)
	if n := held.scans.Load(); n != 1 {
		t.Fatalf("%d scans at the start, want 1", n)
	}

	h.clk.Set(base.Add(600 * time.Millisecond)) // less than half the horizon loaded: a scan
	select {
	case <-held.started:
	case <-time.After(10 * time.Second):
		t.Fatal("no second scan")
	}
	h.put("late@1200", 1200, 0) // after the scan read the store
	h.clk.Set(base.Add(700 * time.Millisecond))
	testwait.Until(t, 10*time.Second, "b@700 to be released while the scan is held", func() bool {
		return len(h.rel.released()) == 2
	})
	h.wantReleased("a@100", "b@700")

	close(held.release)
	h.settle()
	h.advance(500 * time.Millisecond) // +1200
	h.wantReleased("a@100", "b@700", "late@1200")
	h.advance(300 * time.Millisecond) // +1500
	h.wantReleased("a@100", "b@700", "late@1200", "far@1500")
}

// scanPace is the real store, recording when (on the fake clock) each scan
// ran and how many keys it gave the loader.
type scanPace struct {
	Store
	clk *ManualClock

	mu   sync.Mutex // guards at and keys
	at   []int64
	keys []int
}

func (p *scanPace) ScanKeys(from, until int64, fn func(store.Key) error) error {
	n := 0
	err := p.Store.ScanKeys(from, until, func(k store.Key) error {
		err := fn(k)
		if err == nil {
			n++
		}
		return err
	})
	p.mu.Lock()
	p.at, p.keys = append(p.at, p.clk.Now().UnixMilli()-t0), append(p.keys, n)
	p.mu.Unlock()
	return err
}

// TestRescanReadsAgainInPacedChunks: a rescan reads the loaded horizon
// again in chunks of at most rescanChunk keys, rescanGap apart, instead of
// all of it at once in the loop's way; what it reads again is no-ops, and
// every message is released once.
func TestRescanReadsAgainInPacedChunks(t *testing.T) {
	h := newHarness(t, Options{Horizon: time.Minute})
	p := &scanPace{Store: h.st, clk: h.clk}
	h.backend = p
	const n = 2000
	for i := range n {
		h.put(fmt.Sprintf("m%04d", i), 10_000+int64(i)*10, 0) // 10 s to 30 s
	}
	h.start()
	h.settle()
	p.mu.Lock()
	p.at, p.keys = nil, nil
	p.mu.Unlock()
	h.s.Rescan()
	h.settle()
	for range 50 {
		h.advance(time.Millisecond)
	}
	p.mu.Lock()
	at, keys := slices.Clone(p.at), slices.Clone(p.keys)
	p.mu.Unlock()
	total := 0
	for i, k := range keys {
		total += k
		if k > rescanChunk {
			t.Errorf("scan %d of the rescan read %d keys, want at most %d", i, k, rescanChunk)
		}
		if i > 0 && at[i]-at[i-1] < rescanGap.Milliseconds() {
			t.Errorf("scans %d and %d of the rescan at +%d and +%d ms: closer than %v", i-1, i, at[i-1], at[i], rescanGap)
		}
	}
	if total < n {
		t.Fatalf("the rescan read %d keys again in %d scans, want all %d", total, len(keys), n)
	}
	h.advance(31 * time.Second)
	if got := h.rel.released(); len(got) != n {
		t.Fatalf("released %d, want %d once each", len(got), n)
	}
}
