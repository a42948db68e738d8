package lease

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// node is one lease of a test cluster, run with a recorder, its loop
// pausable (as by SIGSTOP: nothing runs, its connections stay).
type node struct {
	l       *Lease
	rec     *recorder
	stop    func()
	paused  atomic.Bool
	unpause chan struct{}
	resume  func() // SIGCONT
}

// startNodes runs n leases on schema.
func startNodes(t *testing.T, schema string, n int) []*node {
	var nodes []*node
	for i := range n {
		nd := &node{rec: &recorder{}, unpause: make(chan struct{})}
		nd.resume = sync.OnceFunc(func() { close(nd.unpause) })
		nd.l = open(t, schema, string(rune('a'+i)), nil)
		nd.l.beforeTick = func() {
			if nd.paused.Load() {
				<-nd.unpause
			}
		}
		nd.stop = run(t, nd.l, nd.rec.lead)
		t.Cleanup(nd.resume) // before the stop (cleanups run last first), or a failed test hangs in it
		nodes = append(nodes, nd)
	}
	return nodes
}

// held lists the roles each node holds now.
func held(nodes []*node) [][]int {
	out := make([][]int, len(nodes))
	for i, nd := range nodes {
		out[i] = nd.l.heldSet()
	}
	return out
}

// spread reports whether the nodes hold every role between them, each at
// most its share, and each node's term runs on the roles it holds.
func spread(nodes []*node, counts ...int) bool {
	hs := held(nodes)
	covered := map[int]bool{}
	var got []int
	for i, h := range hs {
		for _, p := range h {
			covered[p] = true
		}
		got = append(got, len(h))
		_, active, last := nodes[i].rec.state()
		if len(h) > 0 && (!active || !slices.Equal(last, h)) {
			return false
		}
	}
	slices.Sort(got)
	return len(covered) == partitions && slices.Equal(got, counts)
}

// watchHolders samples Held of every role on every node until the test
// ends, and fails the test if two nodes ever hold one role at once.
func watchHolders(t *testing.T, nodes []*node) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var samples atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			start := time.Now()
			var holders [partitions][]int
			for i, nd := range nodes {
				for p := range partitions {
					if nd.l.Held(p) {
						holders[p] = append(holders[p], i)
					}
				}
			}
			// A sample is an instant if it took less than the margin by
			// which a deadline passes before another node may take a role.
			if time.Since(start) > DefaultMargin/5 {
				continue
			}
			samples.Add(1)
			for p, h := range holders {
				if len(h) > 1 {
					t.Errorf("role %d held by nodes %v at once", p, h)
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		t.Logf("%d samples of every node's roles", samples.Load())
	})
}

// Three nodes take every role between them, 3/3/2, never two holders of
// one role. A node whose loop is paused (SIGSTOP) stops holding its roles
// by their local deadlines; the others take them; woken, it holds none
// until the others give it some, and then the roles are spread again. A
// node that stops gives its roles up at once.
func TestThreeNodesSpreadTheRoles(t *testing.T) {
	schema := teststore.PGSchema(t)
	nodes := startNodes(t, schema, 3)
	watchHolders(t, nodes)
	testwait.Until(t, 20*time.Second, "the roles spread 3/3/2", func() bool { return spread(nodes, 2, 3, 3) })
	t.Logf("spread: %v", held(nodes))

	a := nodes[0]
	before := a.l.heldSet()
	terms, _, _ := a.rec.state()
	a.paused.Store(true)
	paused := time.Now()
	testwait.Until(t, 10*time.Second, "b and c to take a's roles", func() bool {
		n := len(nodes[1].l.heldSet()) + len(nodes[2].l.heldSet())
		return n == partitions
	})
	t.Logf("a paused holding %v: b and c hold every role %v later: %v", before, time.Since(paused), held(nodes[1:]))
	if _, active, _ := a.rec.state(); !active {
		t.Fatal("a's term ended although its loop was paused")
	}

	a.resume()
	testwait.Until(t, 5*time.Second, "a's term to end once its loop runs", func() bool {
		n, active, _ := a.rec.state()
		return n > terms || !active
	})
	testwait.Until(t, 20*time.Second, "the roles spread 3/3/2 again", func() bool { return spread(nodes, 2, 3, 3) })
	t.Logf("spread again: %v", held(nodes))
	// What a holds now it was given: each role went to b or c in between,
	// so its epoch is at least 2 past the one a had.
	for _, p := range a.l.heldSet() {
		if e := epochOf(t, schema, p); e < 3 {
			t.Errorf("a holds role %d at epoch %d: it was never another node's", p, e)
		}
	}

	// A graceful stop gives the roles up in the database at once.
	b := nodes[1]
	had := b.l.heldSet()
	b.stop()
	for _, p := range had {
		if h := heldInDB(t, schema, p); h == "b" {
			t.Errorf("role %d still b's in the database after b stopped", p)
		}
	}
	testwait.Until(t, 20*time.Second, "a and c to share the roles 4/4", func() bool { return spread([]*node{a, nodes[2]}, 4, 4) })
}

// epochOf reads role p's epoch in the database.
func epochOf(t *testing.T, schema string, p int) int64 {
	var e int64
	queryRow(t, fmt.Sprintf(`SELECT epoch FROM %s.releaser_lease WHERE role = 'releaser/%d'`, schema, p), &e)
	return e
}

// heldInDB is the holder of role p in the database, "" when expired.
func heldInDB(t *testing.T, schema string, p int) string {
	var h string
	queryRow(t, fmt.Sprintf(`SELECT CASE WHEN expires_at > clock_timestamp() THEN holder ELSE '' END
		FROM %s.releaser_lease WHERE role = 'releaser/%d'`, schema, p), &h)
	return h
}

// queryRow reads the one row of q into dest.
func queryRow(t *testing.T, q string, dest ...any) {
	t.Helper()
	if err := connect(t).QueryRow(context.Background(), q).Scan(dest...); err != nil {
		t.Fatal(err)
	}
}
