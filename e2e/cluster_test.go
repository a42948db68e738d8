package e2e

import (
	"fmt"
	"math/rand/v2"
	"slices"
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
// schema; clients publish delayed messages with confirms through all three
// (each connection to the next node that is up, as a client with several
// hosts does). The node holding the releaser role fails; another takes the
// role and releases from the store. Every confirmed message arrives, none
// early, duplicates within the bound; the clients of a killed node
// reconnect to another and carry on.
func TestCluster_ReleasingNodeFails(t *testing.T) {
	tests := []struct {
		name string
		fail func(n *clusterNode) // makes node n fail
		// recover, if set, brings node n (failed at failed) back and
		// checks it; a node without is gone.
		recover func(t *testing.T, n *clusterNode, failed time.Time)
	}{
		{"SIGKILL", func(n *clusterNode) { n.proc.Kill() }, nil},
		{"SIGSTOP 10s", func(n *clusterNode) { n.proc.Signal(syscall.SIGSTOP) }, func(t *testing.T, n *clusterNode, failed time.Time) {
			time.Sleep(time.Until(failed.Add(10 * time.Second)))
			n.proc.Signal(syscall.SIGCONT)
			woke := time.Now()
			// Its renewal is seconds old: it gives the role up on waking,
			// and releases nothing while another node holds it.
			testwait.Until(t, 5*time.Second, "the woken node to give the role up", func() bool {
				return n.tp.metric(t, "delayproxy_releaser_role") == 0
			})
			t.Logf("woken from SIGSTOP: role gauge 0 within %v", time.Since(woke))
			// Confirms of batches published before the stop may still
			// come in; then nothing more.
			time.Sleep(time.Second)
			released := n.tp.metric(t, "delayproxy_messages_released_total")
			changes := n.tp.metric(t, "delayproxy_releaser_role_changes_total")
			time.Sleep(3 * time.Second)
			if got := n.tp.metric(t, "delayproxy_messages_released_total"); got != released &&
				n.tp.metric(t, "delayproxy_releaser_role_changes_total") == changes {
				t.Errorf("released %v messages after waking without the role", got-released)
			}
			n.down.Store(false)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startCluster(t, 3, teststore.PGURL(), teststore.PGSchema(t))
			h, _ := c.awaitHolder(-1, 15*time.Second)
			t.Logf("node %d holds the releaser role", h)

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
			time.Sleep(time.Duration(rand.Int64N(int64(time.Second))))

			before := make([]float64, len(c.nodes))
			for i, n := range c.nodes {
				before[i] = n.tp.metric(t, "delayproxy_messages_released_total")
			}
			atFail := pubs.Confirmed()
			failed := time.Now()
			c.nodes[h].down.Store(true)
			tt.fail(c.nodes[h])

			h2, seen := c.awaitHolder(h, 10*time.Second)
			testwait.Until(t, 10*time.Second, "the new holder's first release", func() bool {
				return c.nodes[h2].tp.metric(t, "delayproxy_messages_released_total") > before[h2]
			})
			t.Logf("%s of node %d with %d confirmed: node %d holds the role after %v, releases after %v",
				tt.name, h, atFail, h2, seen.Sub(failed), time.Since(failed))
			if tt.recover != nil {
				tt.recover(t, c.nodes[h], failed)
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
			c.finish(t, got, pubs, &dues, 40*time.Second)
		})
	}
}
