package e2e

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// clusterBound is the most duplicates one loss of the releaser role may
// cause: the releases the old holder had in flight or awaiting their
// delete, which the next holder releases again (README, Cluster mode).
const clusterBound = releaseWindow

// TestCluster_ReleasingNodeFails: three proxy processes on one PostgreSQL
// schema, the releaser roles of the partitions spread over them (each
// holds some); clients publish delayed messages with confirms through all
// three (each connection to the next node that is up, as a client with
// several hosts does) to one delayed exchange, whose partition one node
// releases. That node fails; the others take all its partitions and
// release from the store. Every confirmed message arrives, none early,
// duplicates within the bound; the clients of a killed node reconnect to
// another and carry on.
// failure is when a node failed, and the releaser roles it held and the
// changes of its roles it had counted then.
type failure struct {
	at             time.Time
	roles, changes float64
}

func TestCluster_ReleasingNodeFails(t *testing.T) {
	tests := []struct {
		name string
		fail func(n *clusterNode) // makes node n fail
		// recover, if set, brings node n of c (failed as f says) back and
		// checks it; a node without is gone.
		recover func(t *testing.T, c *cluster, n *clusterNode, f failure)
	}{
		{"SIGKILL", func(n *clusterNode) { n.proc.Kill() }, nil},
		{"SIGSTOP 10s", func(n *clusterNode) { n.proc.Signal(syscall.SIGSTOP) }, func(t *testing.T, c *cluster, n *clusterNode, f failure) {
			lost := strings.Count(n.proc.Log(), "releaser role lost")
			time.Sleep(time.Until(f.at.Add(10 * time.Second)))
			n.proc.Signal(syscall.SIGCONT)
			woke := time.Now()
			// Its renewals are seconds old: it gives its roles up on
			// waking, and releases nothing until it holds some again (the
			// others give it some back, being above their share).
			testwait.Until(t, 5*time.Second, "the woken node to give its roles up", func() bool {
				return strings.Count(n.proc.Log(), "releaser role lost") >= lost+int(f.roles)
			})
			t.Logf("woken from SIGSTOP: its %v roles lost within %v", f.roles, time.Since(woke))
			// Confirms of batches published before the stop may still
			// come in; then nothing more unless it took roles again.
			time.Sleep(time.Second)
			released := n.tp.metric(t, "delayproxy_messages_released_total")
			time.Sleep(3 * time.Second)
			if got := n.tp.metric(t, "delayproxy_messages_released_total"); got != released &&
				n.tp.metric(t, "delayproxy_releaser_role_changes_total") <= f.changes+f.roles {
				t.Errorf("released %v messages after waking without a role", got-released)
			}
			n.down.Store(false)
			t.Logf("partitions held once it is back: %v", c.awaitSpread(20*time.Second))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startCluster(t, 3, teststore.PGURL(), teststore.PGSchema(t))
			t.Logf("partitions held by each node: %v", c.awaitSpread(20*time.Second))

			ex, got := c.delayedQueue(t)

			var dues dueLedger
			tag := randHex(t, 4)
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			pubs := crashtest.StartPublishers(6, func(i int) *crashtest.Publisher {
				name := fmt.Sprintf("dp-cluster %s %d", tag, i)
				return &crashtest.Publisher{
					Name:     name,
					URL:      c.url,
					Exchange: ex,
					// Most due around the failure, some after it.
					Delay:  dues.delay(name, delaySpread(seed+uint64(i), 300*time.Millisecond, 3*time.Second, 6*time.Second, 4*time.Second)),
					Window: 16,
					Rate:   100,
				}
			})
			awaitConfirmedEach(t, pubs, 100)
			h := c.releasing(make([]float64, len(c.nodes)), -1, 15*time.Second)
			t.Logf("node %d releases the exchange's partition", h)
			time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))

			before := c.released()
			atFail := pubs.Confirmed()
			f := failure{roles: c.nodes[h].tp.metric(t, "delayproxy_releaser_role"),
				changes: c.nodes[h].tp.metric(t, "delayproxy_releaser_role_changes_total")}
			failed := time.Now()
			f.at = failed
			c.nodes[h].down.Store(true)
			tt.fail(c.nodes[h])

			seen := c.awaitCovered(10 * time.Second)
			h2 := c.releasing(before, h, 10*time.Second)
			t.Logf("%s of node %d with %d confirmed: the others hold every partition after %v (%v; their logs: the last taken after %v), node %d releases after %v",
				tt.name, h, atFail, seen.Sub(failed), c.roles(), c.lastTaken(failed).Sub(failed), h2, time.Since(failed))
			if tt.recover != nil {
				tt.recover(t, c, c.nodes[h], f)
			}

			carryOn(t, pubs, 50, 30*time.Second)
			cut := 0 // clients whose connection the failure ended
			for _, l := range pubs.Ledgers() {
				if slices.ContainsFunc(l.Ends, func(e crashtest.End) bool { return e.At.After(failed) }) {
					cut++
				}
			}
			t.Logf("every client has 50 more publishes confirmed %v after the failure; %d of them reconnected first", time.Since(failed), cut)
			if tt.recover == nil && cut == 0 {
				t.Error("no client's connection went through the killed node")
			}
			arrivals := c.finish(t, got, pubs, &dues, 40*time.Second)
			t.Logf("releases resumed %v after the failure (the longest pause in the arrivals)", resumed(arrivals, failed).Sub(failed))
		})
	}
}
