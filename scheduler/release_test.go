package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

func TestReleaseOrder(t *testing.T) {
	tests := []struct {
		name string
		step time.Duration // the clock moves to +20 ms in these steps
		want []string
	}{
		{"keeping up: each at its due millisecond", time.Millisecond,
			[]string{"d10-p0", "d15-p1", "d20-p9", "d20-p5", "d20-p0-a", "d20-p0-b", "d20-p0-c"}},
		{"behind: by priority, then due", 20 * time.Millisecond,
			[]string{"d20-p9", "d20-p5", "d15-p1", "d10-p0", "d20-p0-a", "d20-p0-b", "d20-p0-c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{Horizon: time.Second})
			// Stored before the scheduler runs (found by the loader) ...
			h.put("d20-p0-a", 20, 0)
			h.put("d10-p0", 10, 0)
			h.put("d20-p5", 20, 5)
			h.put("d20-p0-b", 20, 0)
			h.start()
			// ... and after (handed over by Added), interleaved in due time.
			h.put("d20-p9", 20, 9)
			h.put("d15-p1", 15, 1)
			h.put("d20-p0-c", 20, 0)
			h.put("d5000-p0", 5000, 0) // beyond the horizon
			for h.clk.Now().Before(base.Add(20 * time.Millisecond)) {
				h.advance(tc.step)
			}
			h.wantReleased(tc.want...)
			h.advance(5 * time.Second)
			h.wantReleased(append(tc.want, "d5000-p0")...)
			if n := h.st.Pending(); n != 0 {
				t.Fatalf("store holds %d messages after all were confirmed", n)
			}
		})
	}
}

func TestPriorityAmongDue(t *testing.T) {
	// Three publishes with the same delay a millisecond apart, priorities
	// 1, 9, 5: at their due milliseconds when releases keep up; by
	// priority when they are behind.
	tests := []struct {
		name string
		run  func(h *harness)
		want []string
	}{
		{"keeping up", func(h *harness) {
			for range 4 {
				h.advance(time.Millisecond)
			}
		}, []string{"p1", "p9", "p5"}},
		{"the loop late", func(h *harness) { h.advance(4 * time.Millisecond) }, []string{"p9", "p5", "p1"}},
		{"the releaser busy", func(h *harness) {
			h.rel.mu.Lock()
			h.rel.block = make(chan struct{})
			h.rel.entered = make(chan struct{}, 10)
			h.rel.mu.Unlock()
			h.put("busy", 1, 0)
			h.clk.Advance(time.Millisecond) // not h.advance: that waits for the release
			select {
			case <-h.rel.entered:
			case <-time.After(10 * time.Second):
				h.t.Fatal("release did not start")
			}
			for range 3 {
				h.clk.Advance(time.Millisecond)
			}
			close(h.rel.block)
			h.settle()
		}, []string{"busy", "p9", "p5", "p1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			h.start()
			h.put("p1", 2, 1)
			h.put("p9", 3, 9)
			h.put("p5", 4, 5)
			h.settle()
			tc.run(h)
			h.wantReleased(tc.want...)
		})
	}
}

func TestBurstDrainsByPriority(t *testing.T) {
	// 100,000 messages published together with random priorities, due
	// within five milliseconds: once due they drain by priority, then due
	// time, then publish order; none is lost, none is early (the recorder
	// checks).
	const n = 100_000
	h := newHarness(t, Options{})
	h.start()
	h.settle()
	r := rand.New(rand.NewPCG(1, 2))
	msgs := make([]*store.Message, 0, n)
	for len(msgs) < n {
		batch := make([]*store.Message, 1000)
		for i := range batch {
			seq := len(msgs) + i
			batch[i] = &store.Message{
				VHost: "/", Exchange: "dx", RoutingKey: "rk", Body: []byte("x"),
				Due: t0 + 500 + int64(seq%5), Delay: 500, Priority: uint8(r.IntN(10)), MessageID: strconv.Itoa(seq), Incarnation: h.incarnation(),
			}
		}
		if err := h.st.Put(context.Background(), batch...); err != nil {
			t.Fatal(err)
		}
		h.s.Added(batch...)
		msgs = append(msgs, batch...)
	}
	h.settle()
	h.wantReleased()
	h.advance(time.Second)
	h.wantReleased(inReleaseOrder(msgs...)...)
	if p := h.st.Pending(); p != 0 {
		t.Fatalf("store holds %d messages after the burst drained", p)
	}
}

func TestNeverEarly(t *testing.T) {
	tests := []struct {
		name    string
		due     int64 // ms after start
		before  bool  // stored before the scheduler starts
		horizon time.Duration
	}{
		{"in the wheel via Added", 250, false, time.Second},
		{"loaded from the store", 250, true, time.Second},
		{"beyond the horizon via Added", 7_500, false, time.Second},
		{"beyond the horizon from the store", 7_500, true, time.Second},
		{"one millisecond", 1, false, time.Second},
		{"an hour with the default horizon", 3_600_000, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{Horizon: tc.horizon})
			if tc.before {
				h.put("m", tc.due, 0)
				h.start()
			} else {
				h.start()
				h.put("m", tc.due, 0)
			}
			// Walk the clock in uneven steps up to 1 ms before due.
			for {
				rem := t0 + tc.due - 1 - h.clk.Now().UnixMilli()
				if rem <= 0 {
					break
				}
				h.advance(time.Duration(rem/2+1) * time.Millisecond)
				h.wantReleased()
			}
			h.wantReleased()
			h.advance(999 * time.Microsecond) // still inside the millisecond before due
			h.wantReleased()
			h.advance(time.Microsecond)
			h.wantReleased("m")
		})
	}
}

func TestRetryUntilConfirmed(t *testing.T) {
	h := newHarness(t, Options{RetryBackoffMin: 100 * time.Millisecond, RetryBackoffMax: 400 * time.Millisecond})
	h.rel.confirm = func(m *store.Message, attempt int) bool {
		switch m.MessageID {
		case "b":
			return attempt > 3
		case "d":
			return true
		}
		return attempt > 1
	}
	h.start()
	a, b, c, d := h.put("a", 10, 0), h.put("b", 10, 0), h.put("c", 20, 0), h.put("d", 200, 0)
	h.advance(20 * time.Millisecond) // [a b c]: none confirmed; wait 100 ms
	if got := h.stored(a, b, c); !slices.Equal(got, []bool{true, true, true}) {
		t.Fatalf("after unconfirmed releases the store holds %v, want all", got)
	}
	h.advance(99 * time.Millisecond)
	h.wantReleased()
	h.advance(time.Millisecond) // [a b c]: a and c confirmed; wait 200 ms
	h.wantReleased("a", "c")
	if got := h.stored(a, b, c); !slices.Equal(got, []bool{false, true, false}) {
		t.Fatalf("store holds %v, want only b", got)
	}
	// d falls due while b waits: it does not overtake b.
	h.advance(100 * time.Millisecond)
	h.wantReleased("a", "c")
	h.advance(100 * time.Millisecond) // [b d]: d confirmed; wait 400 ms
	h.wantReleased("a", "c", "d")
	h.advance(399 * time.Millisecond)
	h.wantReleased("a", "c", "d")
	h.advance(time.Millisecond) // [b]
	h.wantReleased("a", "c", "d", "b")
	if got := h.stored(a, b, c, d); slices.Contains(got, true) {
		t.Fatalf("store still holds %v after confirmation", got)
	}
	if got, want := h.rel.batchIDs(), [][]string{{"a", "b", "c"}, {"a", "b", "c"}, {"b", "d"}, {"b"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}

// TestBatchesFailingTogetherBackOffOnce: batches in flight together that
// fail together (a connection lost under them) are one failure: releases
// pause for RetryBackoffMin, not for a backoff doubled once per batch.
func TestBatchesFailingTogetherBackOffOnce(t *testing.T) {
	const batches = 8
	h := newHarness(t, Options{BatchSize: 1, MaxInFlight: batches, RetryBackoffMin: 100 * time.Millisecond, RetryBackoffMax: 30 * time.Second})
	h.rel.confirm = func(m *store.Message, attempt int) bool { return attempt > 1 }
	h.rel.block = make(chan struct{})
	h.rel.entered = make(chan struct{}, batches)
	var want []string
	for i := range batches {
		want = append(want, h.put(fmt.Sprintf("m%d", i), 0, 0).MessageID)
	}
	h.start()
	for range batches {
		select {
		case <-h.rel.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("releases did not start")
		}
	}
	close(h.rel.block) // all fail at once
	h.settle()
	h.wantReleased()
	h.advance(99 * time.Millisecond)
	h.wantReleased()
	h.advance(time.Millisecond)
	got := h.rel.released() // the batches ran side by side: any order
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("released %v %v after the failure, want all of %v after RetryBackoffMin", got, 100*time.Millisecond, want)
	}
}

func TestStaleDiscarded(t *testing.T) {
	h := newHarness(t, Options{})
	h.start()
	old := []*store.Message{h.put("old1", 10, 0), h.put("old2", 20, 0)}
	ctx := context.Background()
	if _, err := h.st.DeleteExchange(ctx, "/", "dx"); err != nil {
		t.Fatal(err)
	}
	if err := h.st.PutExchange(ctx, &store.ExchangeDef{VHost: "/", Name: "dx", DelayedType: "direct"}); err != nil {
		t.Fatal(err)
	}
	fresh := h.put("new", 15, 0)
	h.advance(time.Second)
	h.wantReleased("new")
	if got := h.stored(append(old, fresh)...); slices.Contains(got, true) {
		t.Fatalf("store holds %v; stale messages should be deleted", got)
	}
}

func TestRateLimit(t *testing.T) {
	h := newHarness(t, Options{Rate: 20}) // 20/s: bucket of 2
	for i := range 30 {
		h.put(fmt.Sprintf("m%02d", i), -1000, 0)
	}
	h.start()
	h.settle()
	got := len(h.rel.released())
	if got != 2 {
		t.Fatalf("released %d at once, want the bucket of 2", got)
	}
	for i := 1; i <= 10; i++ {
		h.advance(100 * time.Millisecond)
		got = len(h.rel.released())
		if want := 2 + 2*i; got != want {
			t.Fatalf("after %d ms released %d, want %d", i*100, got, want)
		}
	}
}

func TestMaxInFlight(t *testing.T) {
	h := newHarness(t, Options{BatchSize: 4, MaxInFlight: 8})
	h.rel.block = make(chan struct{})
	h.rel.entered = make(chan struct{}, 100)
	for i := range 40 {
		h.put(fmt.Sprintf("m%02d", i), 0, 0)
	}
	h.start()
	// Two batches of 4 reach Release and block there.
	for range 2 {
		select {
		case <-h.rel.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("releases did not start")
		}
	}
	close(h.rel.block)
	h.settle()
	if h.rel.maxSeen > 8 {
		t.Fatalf("%d messages were in flight at once, want at most 8", h.rel.maxSeen)
	}
	if got := len(h.rel.released()); got != 40 {
		t.Fatalf("released %d of 40", got)
	}
}

// counts is the Metrics test double: it records what it is told.
type counts struct {
	mu        sync.Mutex // guards released, late and discarded
	released  int
	late      []time.Duration
	discarded int
}

func (c *counts) Released(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released += n
}

func (c *counts) ReleaseLateness(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.late = append(c.late, d)
}

func (c *counts) Discarded(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.discarded += n
}

func TestMetrics(t *testing.T) {
	m := &counts{}
	h := newHarness(t, Options{Metrics: m})
	h.rel.confirm = func(msg *store.Message, attempt int) bool { return msg.MessageID != "nacked" }
	h.start()
	h.put("late", -250, 0) // announced 250 ms after its due time
	h.settle()
	h.put("on-time", 10, 0)
	h.put("nacked", 10, 0)
	h.advance(10 * time.Millisecond)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released != 2 || !slices.Equal(m.late, []time.Duration{250 * time.Millisecond, 0}) {
		t.Fatalf("released %d with lateness %v, want 2 with [250ms 0s]", m.released, m.late)
	}
}

func TestPipelinedReleaserKeepsOrderWithBatchesInFlight(t *testing.T) {
	h := newHarness(t, Options{BatchSize: 4, MaxInFlight: 64})
	p := &pipeline{recorder: h.rel, open: make(chan struct{}), published: make(chan []string, 100)}
	h.piped = p
	var msgs []*store.Message
	for i := range 40 {
		// Due in five groups from +1 ms, mixed priorities.
		msgs = append(msgs, h.put(fmt.Sprintf("m%02d", i), 1+int64(i/8), uint8(i%3)))
	}
	want := inReleaseOrder(msgs...) // all due at once: by priority, then due
	h.start()
	h.clk.Advance(10 * time.Millisecond) // not h.advance: that waits for confirms
	// Every batch is published before any confirm arrives: pipelined.
	if got := p.awaitPublished(t, 40); !slices.Equal(got, want) {
		t.Fatalf("published in order\n%v\nwant\n%v", got, want)
	}
	close(p.open)
	h.settle()
	if n := len(h.rel.released()); n != 40 {
		t.Fatalf("released %d of 40", n)
	}
	for i, ok := range h.stored(msgs...) {
		if ok {
			t.Fatalf("message %d still stored after its confirm", i)
		}
	}
}

// slowGets is a store whose Get takes a while, varying by call, as a read
// from a database over a network does: reads started in order finish out
// of order.
type slowGets struct {
	Store
	mu sync.Mutex // guards n
	n  int
}

func (s *slowGets) Get(keys []store.Key) ([]*store.Message, error) {
	s.mu.Lock()
	s.n++
	d := time.Duration(s.n%4) * time.Millisecond
	s.mu.Unlock()
	time.Sleep(d) // real time: the reads overlap for real
	return s.Store.Get(keys)
}

// TestBatchesReadAheadKeepOrder: batches are read from the store ahead of
// the one being published, and still published in release order when the
// reads finish out of order.
func TestBatchesReadAheadKeepOrder(t *testing.T) {
	h := newHarness(t, Options{BatchSize: 4, MaxInFlight: 64})
	h.backend = &slowGets{Store: h.st}
	p := &pipeline{recorder: h.rel, open: make(chan struct{}), published: make(chan []string, 100)}
	h.piped = p
	var msgs []*store.Message
	for i := range 40 {
		msgs = append(msgs, h.put(fmt.Sprintf("m%02d", i), 1+int64(i/8), uint8(i%3)))
	}
	want := inReleaseOrder(msgs...)
	h.start()
	h.clk.Advance(10 * time.Millisecond)
	if got := p.awaitPublished(t, 40); !slices.Equal(got, want) {
		t.Fatalf("published in order\n%v\nwant\n%v", got, want)
	}
	close(p.open)
	h.settle()
}

// failFirstGet is a store whose Get fails once, for the batch that starts
// with key first.
type failFirstGet struct {
	Store
	first  store.Key
	failed atomic.Bool
}

func (s *failFirstGet) Get(keys []store.Key) ([]*store.Message, error) {
	if keys[0] == s.first && s.failed.CompareAndSwap(false, true) {
		return nil, errors.New("the database went away for a moment")
	}
	return s.Store.Get(keys)
}

// TestRefusedBatchIsNotOvertaken: when the first of the batches in flight
// is refused before it is written (its read failed, or the Releaser
// refused it), the batches dispatched with it are not published ahead of
// it: all of them go back, and after the retry backoff they go out in
// release order.
func TestRefusedBatchIsNotOvertaken(t *testing.T) {
	for _, tc := range []string{"read failed", "releaser refused"} {
		t.Run(tc, func(t *testing.T) {
			h := newHarness(t, Options{BatchSize: 4, MaxInFlight: 64})
			p := &pipeline{recorder: h.rel, open: make(chan struct{}), published: make(chan []string, 100)}
			close(p.open) // confirms at once
			h.piped = p
			var msgs []*store.Message
			for i := range 40 {
				msgs = append(msgs, h.put(fmt.Sprintf("m%02d", i), 1+int64(i/8), uint8(i%3)))
			}
			want := inReleaseOrder(msgs...)
			var first *store.Message
			for _, m := range msgs {
				if m.MessageID == want[0] {
					first = m
				}
			}
			switch tc {
			case "read failed":
				h.backend = &failFirstGet{Store: h.st, first: first.Key}
			case "releaser refused":
				refused := false // publishLoop's goroutine alone calls refuse
				p.refuse = func(batch []*store.Message) bool {
					if refused || batch[0].MessageID != first.MessageID {
						return false
					}
					refused = true
					return true
				}
			}
			h.start()
			h.advance(10 * time.Millisecond) // every batch dispatched at once; the first refused
			if n := len(p.published); n != 0 {
				t.Fatalf("%d batches published while the first was refused", n)
			}
			h.advance(100 * time.Millisecond) // the retry backoff
			if got := p.awaitPublished(t, 40); !slices.Equal(got, want) {
				t.Fatalf("published in order\n%v\nwant\n%v", got, want)
			}
			h.settle()
		})
	}
}
