package lease

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/scheduler"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// partitions is the number of roles the tests use, as the store's.
const partitions = 8

// open opens a lease of node holder on schema, closed when the test ends.
func open(t *testing.T, schema, holder string, change func(*Config)) *Lease {
	t.Helper()
	cfg := Config{URL: teststore.PGURL(), Schema: schema, Partitions: partitions, Holder: holder, Logger: testlog.New()}
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

// connect connects to the test database, closed when the test ends.
func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), teststore.PGURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// takeOnce is one attempt to take roles parts.
func takeOnce(t *testing.T, l *Lease, parts ...int) map[int]int64 {
	t.Helper()
	taken, err := l.take(context.Background(), parts)
	if err != nil {
		t.Fatal(err)
	}
	return taken
}

func TestShare(t *testing.T) {
	tests := []struct{ roles, nodes, want int }{
		{8, 0, 8}, {8, 1, 8}, {8, 2, 4}, {8, 3, 3}, {8, 4, 2}, {8, 5, 2}, {8, 7, 2}, {8, 8, 1}, {8, 9, 1}, {1, 3, 1},
	}
	for _, tt := range tests {
		if got := share(tt.roles, tt.nodes); got != tt.want {
			t.Errorf("share(%d roles, %d nodes) = %d, want %d", tt.roles, tt.nodes, got, tt.want)
		}
	}
}

func TestPlan(t *testing.T) {
	// roles reads a line of 8 roles: '.' held by another node (or this
	// one), 'x' expired, 'X' expired for longer than a renew interval, 'o'
	// this node's in the database, unexpired.
	roles := func(s string) []roleState {
		out := make([]roleState, len(s))
		for i, c := range s {
			out[i] = roleState{expired: c == 'x' || c == 'X', longExpired: c == 'X', own: c == 'o'}
		}
		return out
	}
	// set reads a line of 8: '1' in the set.
	set := func(s string) []bool {
		out := make([]bool, len(s))
		for i, c := range s {
			out[i] = c == '1'
		}
		return out
	}
	tests := []struct {
		name                 string
		held, leaving, roles string
		nodes                int
		wantTake             []int
		wantGiveUp           int
	}{
		{"alone: takes every expired role", "00000000", "00000000", "xxxxxxxx", 1, []int{0, 1, 2, 3, 4, 5, 6, 7}, -1},
		{"one of three: takes its share", "00000000", "00000000", "xxxxxxxx", 3, []int{0, 1, 2}, -1},
		{"takes up to its share", "11000000", "00000000", "..xxxxxx", 3, []int{2}, -1},
		{"at its share: leaves an expired role to others", "11100000", "00000000", "...x....", 3, nil, -1},
		{"coverage first: a role nobody took", "11100000", "00000000", "...X....", 3, []int{3}, -1},
		{"the long expired ones before the others", "00000000", "00000000", "xxxxxxXX", 4, []int{6, 7}, -1},
		{"above its share: gives one up", "11110000", "00000000", "........", 3, nil, 3},
		{"above its share while a role is expired: keeps them", "11110000", "00000000", "....x...", 3, nil, -1},
		{"one give-up at a time", "11110000", "00001000", "........", 3, nil, -1},
		{"does not take back what it gives up", "11100000", "00010000", "...X....", 3, nil, -1},
		{"at its share: nothing", "00000111", "00000000", "........", 3, nil, -1},
		{"takes back its own roles it lost locally", "00111111", "00000000", "oo......", 1, []int{0, 1}, -1},
		{"does not take back its own role it gives up", "11100000", "00010000", "...o....", 3, nil, -1},
	}
	for _, tt := range tests {
		take, giveUp := plan(set(tt.held), set(tt.leaving), roles(tt.roles), tt.nodes)
		if !slices.Equal(take, tt.wantTake) || giveUp != tt.wantGiveUp {
			t.Errorf("%s: take %v, give up %d; want %v, %d", tt.name, take, giveUp, tt.wantTake, tt.wantGiveUp)
		}
	}
}

// Nodes taking the same expired roles at once: each role goes to one.
func TestTakeRacesHaveOneWinnerPerRole(t *testing.T) {
	schema := teststore.PGSchema(t)
	const nodes = 4
	ls := make([]*Lease, nodes)
	for i := range ls {
		ls[i] = open(t, schema, string(rune('a'+i)), nil)
	}
	all := []int{0, 1, 2, 3, 4, 5, 6, 7}
	var first [partitions]int // the node that took each role in round 0
	for round := range 3 {
		var mu sync.Mutex // guards winners
		winners := make([][]int, partitions)
		var wg sync.WaitGroup
		for i, l := range ls {
			// Each node names the roles in another order.
			parts := slices.Clone(all)
			if i%2 == 1 {
				slices.Reverse(parts)
			}
			wg.Go(func() {
				taken, err := l.take(context.Background(), parts)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				defer mu.Unlock()
				for p := range taken {
					winners[p] = append(winners[p], i)
				}
			})
		}
		wg.Wait()
		// Round 0 races for expired roles; later rounds, the holders
		// renew theirs and the others are refused.
		for p, w := range winners {
			if len(w) != 1 {
				t.Fatalf("round %d: role %d taken by nodes %v, want one", round, p, w)
			}
			if round == 0 {
				first[p] = w[0]
			} else if w[0] != first[p] {
				t.Fatalf("round %d: role %d taken by node %d from node %d", round, p, w[0], first[p])
			}
		}
	}
}

func TestTakeExpiryTakeoverAndEpochs(t *testing.T) {
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
		{"a takes it again: same epoch", a, 0, true, 1},
		{"b takes it once expired: next epoch", b, 500 * time.Millisecond, true, 2},
		{"a is refused", a, 0, false, 0},
		{"a takes it back once expired", a, 500 * time.Millisecond, true, 3},
	}
	for _, s := range steps {
		time.Sleep(s.wait)
		epoch, ok := takeOnce(t, s.l, 5)[5]
		if ok != s.wantOK || epoch != s.wantEpoch {
			t.Fatalf("%s: ok=%v epoch=%d, want ok=%v epoch=%d", s.name, ok, epoch, s.wantOK, s.wantEpoch)
		}
	}
}

// recorder is a lead that records its terms.
type recorder struct {
	mu     sync.Mutex // guards terms and active
	terms  [][]int
	active bool
}

func (r *recorder) lead(ctx context.Context, parts []int) {
	r.mu.Lock()
	r.terms = append(r.terms, parts)
	r.active = true
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.active = false
	r.mu.Unlock()
}

// state is the number of terms so far, whether one runs, and the last one's
// roles.
func (r *recorder) state() (terms int, active bool, last []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.terms) > 0 {
		last = r.terms[len(r.terms)-1]
	}
	return len(r.terms), r.active, last
}

// run runs l until the test ends, or stop.
func run(t *testing.T, l *Lease, lead func(context.Context, []int)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx, lead) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// openPaused opens node a's lease on schema with a manual clock. Its ticks
// from the second on wait until resume is called; call it before the test
// ends (defer), or Run cannot stop.
func openPaused(t *testing.T, schema string) (a *Lease, clock *scheduler.ManualClock, resume func()) {
	t.Helper()
	clock = scheduler.NewManualClock(time.Unix(1_000_000, 0))
	var ticks atomic.Int32
	paused := make(chan struct{})
	a = open(t, schema, "a", func(c *Config) { c.Clock = clock })
	a.beforeTick = func() {
		if ticks.Add(1) > 1 {
			<-paused
		}
	}
	return a, clock, sync.OnceFunc(func() { close(paused) })
}

// The local deadline of a role is the time the successful take or renewal
// was sent, plus TTL less Margin, on the node's own clock; when the clock
// jumps past it (as when the process wakes from SIGSTOP) the role is no
// longer held although the database still names the node.
func TestLocalDeadlineIsSendTimePlusTTLLessMargin(t *testing.T) {
	schema := teststore.PGSchema(t)
	a, clock, resume := openPaused(t, schema)
	defer resume() // one tick only
	sent := clock.Now()
	r := &recorder{}
	run(t, a, r.lead)
	testwait.Until(t, 5*time.Second, "a to take the roles", func() bool { return a.Held(partitions - 1) })

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
		for p := range partitions {
			if got := a.Held(p); got != tt.want {
				t.Errorf("Held(%d) at send+%v = %v, want %v", p, tt.at.Sub(sent), got, tt.want)
			}
		}
	}
	if taken := takeOnce(t, open(t, schema, "b", nil), 0, 1, 2, 3, 4, 5, 6, 7); len(taken) > 0 {
		t.Errorf("the database gave b roles %v: a's leases had not expired there", taken)
	}
}

// A renewal that comes back after the role's local deadline passed, but
// before the deadline it sets, does not make the role held again in the
// same term: Held was false meanwhile (the fence refused the term's
// actions), so the term ends, and the role taken again makes a new one.
// Otherwise the old term's later actions would pass the fence and
// overtake those it refused. The renewal is held up for real: the test
// locks the role rows while the tick is out.
func TestDeadlinePassedDuringTheRenewalEndsTheTerm(t *testing.T) {
	schema := teststore.PGSchema(t)
	a, clock, resume := openPaused(t, schema)
	defer resume()
	sent := clock.Now()
	r := &recorder{}
	run(t, a, r.lead)
	testwait.Until(t, 5*time.Second, "a's first term", func() bool {
		n, active, _ := r.state()
		return n == 1 && active
	})

	// Lock the role rows, then let the second tick renew into the lock.
	ctx := context.Background()
	lock, err := connect(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "SELECT 1 FROM "+a.roles+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	clock.Set(sent.Add(DefaultRenew)) // the second tick's send time
	resume()
	waiting := connect(t)
	testwait.Until(t, 5*time.Second, "the renewal to wait for the lock", func() bool {
		var n int
		err := waiting.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, schema).Scan(&n)
		return err == nil && n > 0
	})

	// Past the first deadline, before the one the renewal sets.
	clock.Set(sent.Add(DefaultTTL - DefaultMargin + 100*time.Millisecond))
	if a.Held(0) {
		t.Fatal("held past its local deadline")
	}
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "a second term on the roles taken again", func() bool {
		n, active, last := r.state()
		return n == 2 && active && len(last) == partitions
	})
	if !a.Held(0) {
		t.Error("the role is not held in the second term")
	}
}

// A node of the version with one role for the whole cluster loses that
// role once a node with partitions opens the lease, and cannot take it
// again: the old statement, taking the row when expired or its own,
// finds it held for ever by no node.
func TestOpenFencesTheLegacyRole(t *testing.T) {
	schema := teststore.PGSchema(t)
	open(t, schema, "a", nil) // creates the table
	db := connect(t)
	exec := func(q string) int64 {
		t.Helper()
		tag, err := db.Exec(context.Background(), strings.ReplaceAll(q, "S.", schema+"."))
		if err != nil {
			t.Fatal(err)
		}
		return tag.RowsAffected()
	}
	exec(`UPDATE S.releaser_lease SET holder = 'old', expires_at = clock_timestamp() + interval '1 hour' WHERE role = 'releaser'`)
	open(t, schema, "b", nil)
	// The statement of the older version, renewing or taking.
	old := `INSERT INTO S.releaser_lease AS l (role, holder, epoch, expires_at)
		VALUES ('releaser', 'old', 1, clock_timestamp() + interval '1500 milliseconds')
		ON CONFLICT (role) DO UPDATE SET holder = EXCLUDED.holder,
			epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END, expires_at = EXCLUDED.expires_at
		WHERE l.holder = EXCLUDED.holder OR l.expires_at < clock_timestamp()`
	if n := exec(old); n != 0 {
		t.Fatal("the old node renewed the legacy role")
	}
	if n := exec(strings.ReplaceAll(old, "'old'", "'other'")); n != 0 {
		t.Fatal("another old node took the legacy role")
	}
}
