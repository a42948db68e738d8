package scheduler

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store"
)

// readTimes is a store that records, per message ID, the fake clock's time
// (ms after t0) of the first Get that read it.
type readTimes struct {
	Store
	clk *ManualClock

	mu   sync.Mutex // guards read
	read map[string]int64
}

func (r *readTimes) Get(keys []store.Key) ([]*store.Message, error) {
	msgs, err := r.Store.Get(keys)
	now := r.clk.Now().UnixMilli() - t0
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if _, ok := r.read[string(m.Body)]; m != nil && !ok {
			r.read[string(m.Body)] = now
		}
	}
	return msgs, err
}

// readAt is when id was first read (ms after t0), and whether it was.
func (r *readTimes) readAt(id string) (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.read[id]
	return at, ok
}

func newReadAheadHarness(t *testing.T, ahead time.Duration) (*harness, *readTimes) {
	t.Helper()
	h := newHarness(t, Options{ReadAhead: ahead, BatchSize: 8, MaxInFlight: 64})
	rt := &readTimes{Store: h.st, clk: h.clk, read: map[string]int64{}}
	h.backend = rt
	return h, rt
}

// With ReadAhead, a message is read from the store up to ReadAhead before
// its due time (a batch starting once its first key is due within half of
// it) and released at its due millisecond, never before (the recorder
// fails the test on an early release), in release order among those due
// together.
func TestReadAheadReleasesAtDueTime(t *testing.T) {
	h, rt := newReadAheadHarness(t, 50*time.Millisecond)
	h.start()
	h.settle()
	low := h.put("low@100", 100, 1)
	high := h.put("high@100", 100, 5)
	h.put("m@120", 120, 0)
	h.put("m@300", 300, 0)

	steps := []struct {
		to       time.Duration // the fake clock, after t0
		read     []string      // read from the store by then
		unread   []string      // not read yet
		released []string      // released by then, in order
	}{
		// A batch ahead starts once its first key is due within 25 ms,
		// and takes the keys due within 50 ms.
		{40 * time.Millisecond, nil, []string{"low@100", "m@120"}, nil},
		{74 * time.Millisecond, nil, []string{"low@100", "m@120"}, nil},
		{75 * time.Millisecond, []string{"low@100", "high@100", "m@120"}, []string{"m@300"}, nil},
		{99 * time.Millisecond, nil, []string{"m@300"}, nil},
		{100 * time.Millisecond, nil, []string{"m@300"}, inReleaseOrder(low, high)},
		{120 * time.Millisecond, nil, []string{"m@300"}, append(inReleaseOrder(low, high), "m@120")},
		{300 * time.Millisecond, []string{"m@300"}, nil, append(inReleaseOrder(low, high), "m@120", "m@300")},
	}
	for _, st := range steps {
		h.clk.Set(base.Add(st.to))
		h.settle()
		for _, id := range st.read {
			testwait.Until(t, 10*time.Second, id+" to be read", func() bool {
				_, ok := rt.readAt(id)
				return ok
			})
		}
		for _, id := range st.unread {
			if at, ok := rt.readAt(id); ok {
				t.Fatalf("at +%v: %s read at +%d ms, too far ahead", st.to, id, at)
			}
		}
		h.wantReleased(st.released...)
	}
	for _, id := range []string{"low@100", "high@100", "m@120"} {
		if at, _ := rt.readAt(id); at >= 100 {
			t.Errorf("%s read at +%d ms, not ahead of its due time", id, at)
		}
	}
}

// A message cancelled (deleted, then Cancelled) after it was read ahead is
// not released, and the scheduler holds nothing of it afterwards; Overdue
// does not count messages read ahead and not yet due.
func TestReadAheadCancelledAfterRead(t *testing.T) {
	h, rt := newReadAheadHarness(t, 50*time.Millisecond)
	h.start()
	h.settle()
	gone := h.put("gone@1500", 1500, 0)
	kept := h.put("kept@1500", 1500, 0)

	h.clk.Set(base.Add(1480 * time.Millisecond))
	h.settle()
	testwait.Until(t, 10*time.Second, "the batch to be read", func() bool {
		_, ok := rt.readAt("gone@1500")
		return ok
	})
	if n, _ := h.s.Overdue(); n != 0 {
		t.Errorf("Overdue %d before the due time, want 0", n)
	}
	if ok, err := h.st.CancelKey(context.Background(), gone.Key); err != nil || !ok {
		t.Fatalf("CancelKey: %v, %v", ok, err)
	}
	h.s.Cancelled(gone.Key)
	h.settle()
	h.clk.Set(base.Add(1500 * time.Millisecond))
	h.settle()
	h.wantReleased("kept@1500")
	if got := h.stored(gone, kept); !slices.Equal(got, []bool{false, false}) {
		t.Errorf("stored %v after the release, want neither", got)
	}
	if n := h.s.withdrawn.n.Load(); n != 0 {
		t.Errorf("%d withdrawn keys left", n)
	}
}

// A part read ahead is not published while releases are held for the
// retry of an earlier part that was not confirmed: it goes back with it,
// and the two are released in order after the backoff.
func TestReadAheadHeldBehindARetry(t *testing.T) {
	h, _ := newReadAheadHarness(t, 50*time.Millisecond)
	h.opts.RetryBackoffMin = 100 * time.Millisecond
	h.rel.confirm = func(m *store.Message, attempt int) bool { return m.MessageID != "a@100" || attempt > 1 }
	h.put("a@100", 100, 0)
	h.put("b@120", 120, 0)
	h.start()
	for _, at := range []time.Duration{75, 100, 120, 199, 200} {
		h.clk.Set(base.Add(at * time.Millisecond))
		h.settle()
	}
	h.wantReleased("a@100", "b@120")
	if got, want := h.rel.batchIDs(), [][]string{{"a@100"}, {"a@100", "b@120"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}
