package scheduler

import (
	"context"
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
	// A guard against a hung loop, not a time limit: the 100,000-message
	// burst takes a minute to drain with -race on a busy machine.
	deadline := time.After(3 * time.Minute)
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
	got := h.rel.released()
	if slices.Equal(got, want) || len(got) == 0 && len(want) == 0 {
		return
	}
	if len(want) <= 100 {
		h.t.Fatalf("released %v, want %v", got, want)
	}
	i := 0
	for i < min(len(got), len(want)) && got[i] == want[i] {
		i++
	}
	h.t.Fatalf("released %d, want %d; first difference at %d: %v, want %v", len(got), len(want), i, got[i:min(i+5, len(got))], want[i:min(i+5, len(want))])
}

// inReleaseOrder lists the IDs of msgs in release order among due
// messages: priority descending, then due time, then publish order.
func inReleaseOrder(msgs ...*store.Message) []string {
	msgs = slices.Clone(msgs)
	slices.SortFunc(msgs, func(a, b *store.Message) int { return releaseOrder(a.Key, b.Key) })
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.MessageID
	}
	return ids
}

// pipeline is a PipelinedReleaser over a recorder: Publish records the order
// batches are published in, and each batch's wait blocks until open closes.
// refuse, when set, says which batches Publish refuses, unwritten.
type pipeline struct {
	*recorder
	open      chan struct{}
	published chan []string // one value per Publish, in call order
	refuse    func(batch []*store.Message) bool
}

var _ PipelinedReleaser = (*pipeline)(nil)

// awaitPublished returns the ids of the first n messages published, in
// publish order, and fails t if they are not all published within 10 s.
func (p *pipeline) awaitPublished(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	for len(got) < n {
		select {
		case ids := <-p.published:
			got = append(got, ids...)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d published", len(got), n)
		}
	}
	return got
}

func (p *pipeline) Publish(ctx context.Context, batch []*store.Message) (func() []bool, bool) {
	if p.refuse != nil && p.refuse(batch) {
		return func() []bool { return make([]bool, len(batch)) }, true
	}
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
	}, false
}
