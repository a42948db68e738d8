package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// base is the fake wall clock's start in the scheduler tests.
var base = time.UnixMilli(t0)

// recorder is the Releaser test double: it records what it is given and
// confirms according to confirm (all when nil). It fails the test when a
// message reaches it before its due time on the fake clock.
type recorder struct {
	t   *testing.T
	clk *ManualClock

	mu       sync.Mutex // guards the fields below
	batches  [][]*store.Message
	attempts map[string]int // by message ID
	confirm  func(m *store.Message, attempt int) bool
	block    chan struct{} // when set, Release waits for it to close or ctx to end
	entered  chan struct{} // when set, receives a value as each Release begins
	inflight int
	maxSeen  int
}

func (r *recorder) Release(ctx context.Context, batch []*store.Message) []bool {
	now := r.clk.Now().UnixMilli()
	r.mu.Lock()
	r.inflight += len(batch)
	r.maxSeen = max(r.maxSeen, r.inflight)
	block, entered := r.block, r.entered
	r.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inflight -= len(batch)
	r.batches = append(r.batches, slices.Clone(batch))
	out := make([]bool, len(batch))
	for i, m := range batch {
		if m.Key.Due() > now {
			r.t.Errorf("message %s released at %+d ms, due at %+d ms: early", m.MessageID, now-t0, m.Key.Due()-t0)
		}
		if r.attempts == nil {
			r.attempts = map[string]int{}
		}
		r.attempts[m.MessageID]++
		out[i] = ctx.Err() == nil && (r.confirm == nil || r.confirm(m, r.attempts[m.MessageID]))
	}
	return out
}

// batchIDs lists the IDs of every batch given to Release.
func (r *recorder) batchIDs() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]string
	for _, b := range r.batches {
		var ids []string
		for _, m := range b {
			ids = append(ids, m.MessageID)
		}
		out = append(out, ids)
	}
	return out
}

// released lists the IDs of confirmed messages in release order.
func (r *recorder) released() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	seen := map[string]int{}
	for _, b := range r.batches {
		for _, m := range b {
			seen[m.MessageID]++
			if r.confirm == nil || r.confirm(m, seen[m.MessageID]) {
				ids = append(ids, m.MessageID)
			}
		}
	}
	return ids
}

// snapshot is what the loop reports when it goes idle.
type snapshot struct {
	gen    uint64 // the settle generation seen at the start of the iteration
	nowMs  int64
	loaded int // keys in the wheel
	cursor int64
}

// harness runs a Scheduler over a real store in t.TempDir() with a fake
// clock.
type harness struct {
	t       *testing.T
	path    string
	st      *boltstore.Store
	backend Store // when set, the scheduler's view of st
	clk     *ManualClock
	rel     *recorder
	piped   Releaser // when set, the scheduler releases through it instead of rel
	s       *Scheduler
	opts    Options

	mu      sync.Mutex // guards gen and last
	gen     uint64
	last    snapshot
	idleCh  chan struct{}
	stop    context.CancelFunc
	done    chan error
	loopGen uint64 // read by the loop only
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "delayed.db"), clk: NewManualClock(base)}
	h.rel = &recorder{t: t, clk: h.clk}
	h.opts = opts
	h.open()
	if err := h.st.PutExchange(context.Background(), &store.ExchangeDef{VHost: "/", Name: "dx", DelayedType: "direct"}); err != nil {
		t.Fatal(err)
	}
	return h
}

// open opens the store, checked and closed at cleanup.
func (h *harness) open() {
	h.t.Helper()
	h.st = teststore.Open(h.t, h.path, boltstore.Options{NoSync: true})
}

// start runs a new Scheduler over the store; it is stopped at cleanup.
func (h *harness) start() {
	h.t.Helper()
	opts := h.opts
	opts.Clock = h.clk
	var backend Store = h.st
	if h.backend != nil {
		backend = h.backend
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var r Releaser = h.rel
	if h.piped != nil {
		r = h.piped
	}
	h.s = New(backend, r, opts)
	h.idleCh = make(chan struct{}, 1)
	h.s.testBegin = func() {
		h.mu.Lock()
		h.loopGen = h.gen
		h.mu.Unlock()
	}
	h.s.idle = func(nowMs int64) {
		h.mu.Lock()
		h.last = snapshot{gen: h.loopGen, nowMs: nowMs, loaded: h.s.w.Len(), cursor: h.s.cursor.Due()}
		h.mu.Unlock()
		select {
		case h.idleCh <- struct{}{}:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.s.Run(ctx) }()
	h.t.Cleanup(h.halt)
}

// halt stops the scheduler and checks Run's result.
func (h *harness) halt() {
	if h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatal("Run did not return after cancel")
	}
}

// settle waits until the loop has taken in everything before the call, seen
// the current fake time and has nothing left to do but wait for the clock.
func (h *harness) settle() snapshot {
	h.t.Helper()
	h.mu.Lock()
	h.gen++
	gen := h.gen
	h.mu.Unlock()
	want := h.clk.Now().UnixMilli()
	h.s.kick()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-h.idleCh:
			h.mu.Lock()
			last := h.last
			h.mu.Unlock()
			if last.gen >= gen && last.nowMs >= want {
				return last
			}
		case <-deadline:
			h.t.Fatalf("scheduler did not settle at %+d ms", want-t0)
		}
	}
}

// advance moves the fake clock by d and settles.
func (h *harness) advance(d time.Duration) snapshot {
	h.t.Helper()
	h.clk.Advance(d)
	return h.settle()
}

// incarnation is the live incarnation of dx, which a Put names.
func (h *harness) incarnation() uint64 {
	d, _ := h.st.Exchange("/", "dx")
	return d.Incarnation
}

// put stores a message due at t0+dueMs and tells the scheduler (when it runs).
func (h *harness) put(id string, dueMs int64, prio uint8) *store.Message {
	h.t.Helper()
	m := &store.Message{
		VHost: "/", Exchange: "dx", RoutingKey: "rk", Body: []byte(id),
		Due: t0 + dueMs, Delay: max(dueMs, 1), Priority: prio, MessageID: id, Incarnation: h.incarnation(),
	}
	if err := h.st.Put(context.Background(), m); err != nil {
		h.t.Fatal(err)
	}
	if h.s != nil {
		h.s.Added(m)
	}
	return m
}

// stored reports which of msgs the store still holds.
func (h *harness) stored(msgs ...*store.Message) []bool {
	h.t.Helper()
	keys := make([]store.Key, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	got, err := h.st.Get(keys)
	if err != nil {
		h.t.Fatal(err)
	}
	out := make([]bool, len(got))
	for i, m := range got {
		out[i] = m != nil
	}
	return out
}

func (h *harness) wantReleased(want ...string) {
	h.t.Helper()
	if got := h.rel.released(); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		h.t.Fatalf("released %v, want %v", got, want)
	}
}

func TestReleaseOrder(t *testing.T) {
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
	h.advance(20 * time.Millisecond)
	h.wantReleased("d10-p0", "d15-p1", "d20-p9", "d20-p5", "d20-p0-a", "d20-p0-b", "d20-p0-c")
	h.advance(5 * time.Second)
	h.wantReleased("d10-p0", "d15-p1", "d20-p9", "d20-p5", "d20-p0-a", "d20-p0-b", "d20-p0-c", "d5000-p0")
	if n := h.st.Pending(); n != 0 {
		t.Fatalf("store holds %d messages after all were confirmed", n)
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

func TestRetryUntilConfirmed(t *testing.T) {
	h := newHarness(t, Options{RetryBackoffMin: 100 * time.Millisecond, RetryBackoffMax: 400 * time.Millisecond})
	var retries int
	h.opts.OnRetry = func(n int) { retries += n } // called from the loop only
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
	if retries != 5 { // a, b, c, then b twice
		t.Fatalf("OnRetry counted %d, want 5", retries)
	}
}

func TestStaleDiscarded(t *testing.T) {
	h := newHarness(t, Options{})
	var discarded int
	h.opts.OnDiscarded = func(n int) { discarded += n }
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
	if discarded != 2 {
		t.Fatalf("OnDiscarded counted %d, want 2", discarded)
	}
	if got := h.stored(append(old, fresh)...); slices.Contains(got, true) {
		t.Fatalf("store holds %v; stale messages should be deleted", got)
	}
}

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

func TestLateness(t *testing.T) {
	h := newHarness(t, Options{})
	var mu sync.Mutex // guards late
	late := map[string]time.Duration{}
	h.opts.OnReleased = func(m *store.Message, d time.Duration) {
		mu.Lock()
		late[m.MessageID] = d
		mu.Unlock()
	}
	h.start()
	h.put("on-time", 10, 0)
	h.put("late", -250, 0) // announced 250 ms after its due time
	h.settle()
	h.advance(10 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if late["late"] != 250*time.Millisecond || late["on-time"] != 0 {
		t.Fatalf("lateness %v, want late 250ms and on-time 0", late)
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

// pipeline is a PipelinedReleaser over a recorder: Publish records the order
// batches are published in, and each batch's wait blocks until open closes.
type pipeline struct {
	*recorder
	open      chan struct{}
	published chan []string // one value per Publish, in call order
}

func (p *pipeline) Publish(ctx context.Context, batch []*store.Message) func() []bool {
	ids := make([]string, len(batch))
	for i, m := range batch {
		ids[i] = m.MessageID
	}
	p.published <- ids
	return func() []bool {
		select {
		case <-p.open:
		case <-ctx.Done():
		}
		return p.recorder.Release(ctx, batch)
	}
}

func TestPipelinedReleaserKeepsOrderWithBatchesInFlight(t *testing.T) {
	h := newHarness(t, Options{BatchSize: 4, MaxInFlight: 64})
	p := &pipeline{recorder: h.rel, open: make(chan struct{}), published: make(chan []string, 100)}
	h.piped = p
	var want []string
	var msgs []*store.Message
	for i := range 40 {
		id := fmt.Sprintf("m%02d", i)
		msgs = append(msgs, h.put(id, int64(i/8), uint8(i%3))) // due in five groups, mixed priorities
		want = append(want, id)
	}
	// Release order: due, then priority descending, then publish order.
	slices.SortStableFunc(want, func(a, b string) int {
		var ia, ib int
		fmt.Sscanf(a, "m%d", &ia)
		fmt.Sscanf(b, "m%d", &ib)
		if c := (ia / 8) - (ib / 8); c != 0 {
			return c
		}
		return (ib % 3) - (ia % 3)
	})
	h.start()
	h.clk.Advance(10 * time.Millisecond) // not h.advance: that waits for confirms
	// Every batch is published before any confirm arrives: pipelined.
	var got []string
	for len(got) < 40 {
		select {
		case ids := <-p.published:
			got = append(got, ids...)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of 40 published while confirms were held back", len(got))
		}
	}
	if !slices.Equal(got, want) {
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

// failingDeletes is the real store whose first Delete calls fail, as on a
// full disk.
type failingDeletes struct {
	*boltstore.Store
	mu    sync.Mutex // guards fails
	fails int        // Delete calls still to fail
}

var errDiskFull = errors.New("test: no space left on device")

func (f *failingDeletes) Delete(ctx context.Context, keys ...store.Key) error {
	f.mu.Lock()
	fail := f.fails > 0
	if fail {
		f.fails--
	}
	f.mu.Unlock()
	if fail {
		return errDiskFull
	}
	return f.Store.Delete(ctx, keys...)
}

func TestFailedDeleteIsRetried(t *testing.T) {
	h := newHarness(t, Options{RetryBackoffMin: 100 * time.Millisecond, RetryBackoffMax: 400 * time.Millisecond})
	fd := &failingDeletes{Store: h.st, fails: 3}
	h.backend = fd
	msgs := []*store.Message{h.put("a", 0, 0), h.put("b", 0, 0)}
	h.start()
	h.settle()
	h.wantReleased("a", "b")
	if got := h.stored(msgs...); !got[0] || !got[1] {
		t.Fatalf("stored = %v: the failed deletes cannot have happened", got)
	}
	// Each retry waits for its backoff on the fake clock: 100, 200, 400 ms.
	for range 4 {
		h.advance(400 * time.Millisecond)
	}
	if got := h.stored(msgs...); got[0] || got[1] {
		t.Fatalf("stored = %v after the disk recovered: released messages never deleted", got)
	}
	if n := len(h.rel.released()); n != 2 {
		t.Fatalf("released %d times, want 2 (no release again while deletes fail)", n)
	}
}

func TestDeleteLinger(t *testing.T) {
	tests := []struct {
		name        string
		opts        Options
		storedAfter bool // still stored right after their release
	}{
		{"deletes wait for the linger", Options{DeleteLinger: 50 * time.Millisecond}, true},
		{"MaxInFlight waiting start the delete at once", Options{DeleteLinger: time.Hour, BatchSize: 2, MaxInFlight: 2}, false},
		{"no linger", Options{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.opts)
			msgs := []*store.Message{h.put("a", 0, 0), h.put("b", 0, 0)}
			h.start()
			h.settle()
			h.wantReleased("a", "b")
			if got := h.stored(msgs...); got[0] != tt.storedAfter || got[1] != tt.storedAfter {
				t.Fatalf("stored right after release = %v, want both %v", got, tt.storedAfter)
			}
			h.advance(50 * time.Millisecond)
			if got := h.stored(msgs...); got[0] || got[1] {
				t.Fatalf("stored = %v after the linger: released messages never deleted", got)
			}
			if n := len(h.rel.released()); n != 2 {
				t.Fatalf("released %d times, want 2", n)
			}
		})
	}
}
