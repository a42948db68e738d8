package scheduler

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

func TestRestartDrainsOverdueOldestFirst(t *testing.T) {
	h := newHarness(t, Options{BatchSize: 3})
	var want []store.Key
	ids := map[store.Key]string{}
	// Due over the last hour, priorities mixed, several per due time.
	for i := range 40 {
		due := -int64(3_600_000) + int64(i%7)*500_000
		m := h.put(fmt.Sprintf("m%02d", i), due, uint8(i%4))
		want = append(want, m.Key)
		ids[m.Key] = m.MessageID
	}
	slices.SortFunc(want, store.CompareKeys)
	// Restart: close and reopen the store, then run the scheduler.
	if err := h.st.Close(); err != nil {
		t.Fatal(err)
	}
	h.open()
	h.start()
	h.settle()
	var wantIDs []string
	for _, k := range want {
		wantIDs = append(wantIDs, ids[k])
	}
	h.wantReleased(wantIDs...)
	for _, b := range h.rel.batches {
		if len(b) > 3 {
			t.Fatalf("batch of %d with BatchSize 3", len(b))
		}
	}
	if n := h.st.Pending(); n != 0 {
		t.Fatalf("store holds %d after the drain", n)
	}
}

// scanLog is the real store, recording the ranges the loader asks for.
type scanLog struct {
	*store.Store
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
