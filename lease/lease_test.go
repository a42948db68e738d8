package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open opens a lease of node holder on schema, closed when the test ends.
func open(t *testing.T, schema, holder string, change func(*Config)) *Lease {
	t.Helper()
	cfg := Config{URL: teststore.PGURL(), Schema: schema, Holder: holder, Logger: testlog.New()}
	if change != nil {
		change(&cfg)
	}
	l, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// tryOnce is one attempt to take or renew the role.
func tryOnce(t *testing.T, l *Lease) (int64, bool) {
	t.Helper()
	epoch, ok, err := l.try(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return epoch, ok
}

func TestTryRacesHaveOneWinner(t *testing.T) {
	schema := teststore.PGSchema(t)
	const nodes = 4
	ls := make([]*Lease, nodes)
	for i := range ls {
		ls[i] = open(t, schema, string(rune('a'+i)), nil)
	}
	for round := range 5 {
		var wins atomic.Int32
		var wg sync.WaitGroup
		for _, l := range ls {
			wg.Go(func() {
				if _, ok, err := l.try(context.Background()); err != nil {
					t.Error(err)
				} else if ok {
					wins.Add(1)
				}
			})
		}
		wg.Wait()
		// Round 0 races for a new row, later rounds against its holder.
		if n := wins.Load(); n != 1 {
			t.Fatalf("round %d: %d nodes took the role at once, want 1", round, n)
		}
	}
}

func TestTryExpiryTakeoverAndEpochs(t *testing.T) {
	schema := teststore.PGSchema(t)
	ttl := func(c *Config) {
		c.TTL, c.Renew, c.Margin = 400*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	}
	a, b := open(t, schema, "a", ttl), open(t, schema, "b", ttl)

	steps := []struct {
		name      string
		l         *Lease
		wait      time.Duration // before the attempt
		wantOK    bool
		wantEpoch int64
	}{
		{"a takes the new role", a, 0, true, 1},
		{"b is refused while a's lease runs", b, 0, false, 0},
		{"a renews: same epoch", a, 0, true, 1},
		{"b takes it once expired: next epoch", b, 500 * time.Millisecond, true, 2},
		{"a is refused", a, 0, false, 0},
		{"b renews", b, 0, true, 2},
		{"a takes it back once expired", a, 500 * time.Millisecond, true, 3},
	}
	for _, s := range steps {
		time.Sleep(s.wait)
		epoch, ok := tryOnce(t, s.l)
		if ok != s.wantOK || epoch != s.wantEpoch {
			t.Fatalf("%s: ok=%v epoch=%d, want ok=%v epoch=%d", s.name, ok, epoch, s.wantOK, s.wantEpoch)
		}
	}
}

// recorder is a lead that records its terms.
type recorder struct {
	mu     sync.Mutex // guards epochs and active
	epochs []int64
	active bool
}

func (r *recorder) lead(ctx context.Context, epoch int64) {
	r.mu.Lock()
	r.epochs = append(r.epochs, epoch)
	r.active = true
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.active = false
	r.mu.Unlock()
}

func (r *recorder) state() (terms int, active bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.epochs), r.active
}

func (r *recorder) firstEpoch() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.epochs[0]
}

// run runs l until the test ends.
func run(t *testing.T, l *Lease, lead func(context.Context, int64)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx, lead) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// A holder whose loop is paused (as by SIGSTOP: nothing runs, its
// connection stays) stops holding the role by its local deadline, before
// the database hands the role to another node; woken up, it ends its term
// and does not take the role back while the other renews.
func TestPausedHolderLosesTheRoleFirst(t *testing.T) {
	schema := teststore.PGSchema(t)
	var pauseA atomic.Bool
	unpause := make(chan struct{})
	resume := sync.OnceFunc(func() { close(unpause) }) // SIGCONT
	a := open(t, schema, "a", nil)
	a.beforeTry = func() {
		if pauseA.Load() {
			<-unpause
		}
	}
	ra := &recorder{}
	run(t, a, ra.lead)
	t.Cleanup(resume) // before a's stop (cleanups run last first), or a failed test hangs in it
	testwait.Until(t, 5*time.Second, "a to take the role", a.Held)

	pauseA.Store(true)
	b := open(t, schema, "b", nil)
	var aHeldAtTakeover atomic.Bool
	aHeldAtTakeover.Store(true)
	rb := &recorder{}
	taken := time.Now()
	run(t, b, func(ctx context.Context, epoch int64) {
		aHeldAtTakeover.Store(a.Held())
		rb.lead(ctx, epoch)
	})
	// b's lead records a's view before rb's term: wait for the term, not
	// for b.Held, which is true before lead runs.
	testwait.Until(t, 5*time.Second, "b to take the role", func() bool {
		terms, _ := rb.state()
		return terms == 1
	})
	t.Logf("b took the role %v after a's loop paused", time.Since(taken))
	if aHeldAtTakeover.Load() {
		t.Fatal("a still held the role by its own clock when b took it")
	}
	if _, active := ra.state(); !active {
		t.Fatal("a's term ended although its loop was paused")
	}

	resume()
	testwait.Until(t, 5*time.Second, "a's term to end once its loop runs", func() bool {
		_, active := ra.state()
		return !active
	})
	time.Sleep(3 * DefaultRenew)
	if terms, _ := ra.state(); terms != 1 || a.Held() {
		t.Fatalf("a: %d terms, held %v; want 1 term and not held while b renews", terms, a.Held())
	}
	if e := rb.firstEpoch(); e != 2 {
		t.Fatalf("b's epoch %d, want 2", e)
	}
}

// The local deadline is the time the successful renewal was sent, plus TTL
// less Margin, on the node's own clock; when the clock jumps past it (as
// when the process wakes from SIGSTOP) the role is no longer held although
// the database still names the node.
func TestLocalDeadlineIsSendTimePlusTTLLessMargin(t *testing.T) {
	schema := teststore.PGSchema(t)
	clock := scheduler.NewManualClock(time.Unix(1_000_000, 0))
	var tries atomic.Int32
	block := make(chan struct{})
	a := open(t, schema, "a", func(c *Config) { c.Clock = clock })
	a.beforeTry = func() {
		if tries.Add(1) > 1 {
			<-block // one attempt only
		}
	}
	defer close(block)
	sent := clock.Now()
	r := &recorder{}
	run(t, a, r.lead)
	testwait.Until(t, 5*time.Second, "a to take the role", a.Held)

	deadline := sent.Add(DefaultTTL - DefaultMargin)
	tests := []struct {
		at   time.Time
		want bool
	}{
		{sent.Add(DefaultRenew), true},
		{deadline.Add(-time.Millisecond), true},
		{deadline, false},
		{deadline.Add(time.Hour), false},
	}
	for _, tt := range tests {
		clock.Set(tt.at)
		if got := a.Held(); got != tt.want {
			t.Errorf("Held at send+%v = %v, want %v", tt.at.Sub(sent), got, tt.want)
		}
	}
	if _, ok := tryOnce(t, open(t, schema, "b", nil)); ok {
		t.Error("the database gave b the role: a's lease had not expired there")
	}
}
