package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// clusterNode is one proxy process of a cluster on a shared PostgreSQL
// store (the test binary re-executed, TestReliabilityChildProxy).
type clusterNode struct {
	proc *crashtest.Process
	tp   *testProxy  // its URLs, for the e2e helpers
	down atomic.Bool // killed or stopped: clients and probes leave it alone
}

// cluster is n proxy processes on one schema of one database.
type cluster struct {
	t     *testing.T
	nodes []*clusterNode
	next  atomic.Uint64 // round robin of url
}

// startCluster starts n proxies in front of the test broker with the
// PostgreSQL store at pgURL in schema.
func startCluster(t *testing.T, n int, pgURL, schema string) *cluster {
	t.Helper()
	c := &cluster{t: t}
	upstream := testbroker.URL(t)
	for i := range n {
		amqpAddr, httpAddr := crashtest.FreePort(t), crashtest.FreePort(t)
		proc := crashtest.NewProcess(t, filepath.Join(t.TempDir(), fmt.Sprintf("node%d.log", i)), os.Args[0],
			[]string{"-test.run=^TestReliabilityChildProxy$"},
			[]string{
				childEnv + "=1",
				"DELAYPROXY_LISTEN=" + amqpAddr,
				"DELAYPROXY_HTTP_ADDR=" + httpAddr,
				"DELAYPROXY_UPSTREAM=" + upstream,
				"DELAYPROXY_DATA_DIR=" + t.TempDir(),
				"DELAYPROXY_STORE=" + pgURL,
				"DELAYPROXY_STORE_SCHEMA=" + schema,
				"DELAYPROXY_SHUTDOWN_GRACE=10s",
			})
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("node %d log (last lines):\n%s", i, proc.Tail(40))
			}
		})
		proc.Start(time.Minute)
		c.nodes = append(c.nodes, &clusterNode{proc: proc,
			tp: &testProxy{t: t, amqpURL: withHost(t, upstream, amqpAddr, ""), httpURL: "http://" + httpAddr}})
	}
	return c
}

// url is the AMQP URL of a node that is up, a different one at each call
// (a client list of several hosts, or a load balancer).
func (c *cluster) url() string {
	for range len(c.nodes) {
		n := c.nodes[c.next.Add(1)%uint64(len(c.nodes))]
		if !n.down.Load() {
			return n.tp.URL()
		}
	}
	return c.nodes[0].tp.URL()
}

// roles reads delayproxy_releaser_role of every node: the number of
// partitions each holds, 0 for a node that is down.
func (c *cluster) roles() []int {
	out := make([]int, len(c.nodes))
	for i, n := range c.nodes {
		if !n.down.Load() {
			out[i] = int(n.tp.metric(c.t, "delayproxy_releaser_role"))
		}
	}
	return out
}

// awaitSpread waits until the nodes that are up hold every partition
// between them, each some and at most its share (ceil(partitions / nodes
// up)), and returns what each holds.
func (c *cluster) awaitSpread(within time.Duration) []int {
	c.t.Helper()
	var rs []int
	testwait.Until(c.t, within, "every node to hold its share of the releaser roles, all of them between them", func() bool {
		rs = c.roles()
		up := 0
		for _, n := range c.nodes {
			if !n.down.Load() {
				up++
			}
		}
		share := (pgstore.Partitions + up - 1) / up
		sum := 0
		for i, n := range rs {
			if !c.nodes[i].down.Load() && (n == 0 || n > share) {
				return false
			}
			sum += n
		}
		return sum == pgstore.Partitions
	})
	return rs
}

// awaitCovered waits until the nodes that are up hold every partition
// between them, and returns when it saw it.
func (c *cluster) awaitCovered(within time.Duration) time.Time {
	c.t.Helper()
	testwait.Until(c.t, within, "the nodes up to hold every partition", func() bool {
		sum := 0
		for _, n := range c.roles() {
			sum += n
		}
		return sum == pgstore.Partitions
	})
	return time.Now()
}

// lastTaken is the time of the last role taken after after, by the logs
// of the nodes that are up ("time=... msg=\"releaser role taken\""): when
// they took it, not when a poll of their metrics saw it.
func (c *cluster) lastTaken(after time.Time) time.Time {
	var last time.Time
	for _, n := range c.nodes {
		if n.down.Load() {
			continue
		}
		for line := range strings.Lines(n.proc.Log()) {
			ts, rest, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			if !ok || !strings.Contains(rest, `msg="releaser role taken"`) {
				continue
			}
			if at, err := time.Parse(time.RFC3339Nano, ts); err == nil && at.After(after) && at.After(last) {
				last = at
			}
		}
	}
	return last
}

// released reads delayproxy_messages_released_total of every node that is
// up.
func (c *cluster) released() []float64 {
	out := make([]float64, len(c.nodes))
	for i, n := range c.nodes {
		if !n.down.Load() {
			out[i] = n.tp.metric(c.t, "delayproxy_messages_released_total")
		}
	}
	return out
}

// releasing waits until a node that is up, other than not (-1: any), has
// released more than before, and returns it: with one delayed exchange,
// the node holding its partition.
func (c *cluster) releasing(before []float64, not int, within time.Duration) int {
	c.t.Helper()
	h := -1
	testwait.Until(c.t, within, "a node to release", func() bool {
		for i, n := range c.released() {
			if i != not && !c.nodes[i].down.Load() && n > before[i] {
				h = i
				return true
			}
		}
		return false
	})
	return h
}

// awaitExchange waits until every node that is up knows the delayed
// exchange (the registry is shared; each node's cache hears of it).
func (c *cluster) awaitExchange(ex string) {
	c.t.Helper()
	for i, n := range c.nodes {
		testwait.Until(c.t, 15*time.Second, fmt.Sprintf("node %d to know exchange %s", i, ex), func() bool {
			code, _ := n.tp.httpDo(c.t, http.MethodGet, exchangePath(ex))
			return code == http.StatusOK
		})
	}
}

// stopAll stops every node that is up gracefully; each must exit 0.
func (c *cluster) stopAll() {
	c.t.Helper()
	for i, n := range c.nodes {
		if n.down.Load() {
			continue
		}
		if err := n.proc.Stop(30 * time.Second); err != nil {
			c.t.Errorf("node %d: graceful stop: %v", i, err)
		}
		if n.proc.LogContains("DATA RACE") {
			c.t.Errorf("node %d: the race detector reported a race (see its log)", i)
		}
	}
}

// dueLedger records, for each message-id a Publisher publishes, the
// earliest time it may arrive: when its Delay was asked (just before the
// publish) plus the delay. The proxy times the delay from when it reads
// the publish, later.
type dueLedger struct {
	mu       sync.Mutex // guards earliest
	earliest map[string]time.Time
}

// delay wraps a Publisher's Delay for the publisher named name.
func (d *dueLedger) delay(name string, f func(uint64) time.Duration) func(uint64) time.Duration {
	return func(seq uint64) time.Duration {
		delay := f(seq)
		d.mu.Lock()
		if d.earliest == nil {
			d.earliest = map[string]time.Time{}
		}
		// The proxy reads its clock in whole milliseconds.
		d.earliest[fmt.Sprintf("%s-%d", name, seq)] = time.Now().Truncate(time.Millisecond).Add(delay)
		d.mu.Unlock()
		return delay
	}
}

// early counts the arrivals before their earliest time, and the worst.
func (d *dueLedger) early(got []arrival) (n int, worst time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, a := range got {
		if e, ok := d.earliest[a.MessageId]; ok && a.At.Before(e) {
			n++
			worst = max(worst, e.Sub(a.At))
		}
	}
	return n, worst
}

// carryOn waits until every client has had more publishes confirmed than
// it had when called: clients whose proxy or database failed reconnect (to
// another node when theirs is gone) and carry on.
func carryOn(t *testing.T, pubs *crashtest.Publishers, more int, within time.Duration) {
	t.Helper()
	by := time.Now().Add(within)
	base := make([]int, len(pubs.All()))
	for i, p := range pubs.All() {
		base[i] = len(p.Ledger().Confirmed)
	}
	for i, p := range pubs.All() {
		testwait.Until(t, time.Until(by), fmt.Sprintf("client %d to have %d more publishes confirmed", i, more), func() bool {
			return len(p.Ledger().Confirmed) >= base[i]+more
		})
	}
}

// finish stops the publishers, waits up to within for every confirmed
// message to arrive, checks that none is lost or early and that
// duplicates stay within clusterBound, stops the cluster, and returns the
// arrivals.
func (c *cluster) finish(t *testing.T, got *consumer, pubs *crashtest.Publishers, dues *dueLedger, within time.Duration) []arrival {
	t.Helper()
	ls := pubs.Stop()
	awaitDelivered(t, got, pubs, within)
	arrivals := got.stop(t)
	tally := crashtest.Count(ls, messageIDs(arrivals))
	t.Logf("%v", tally)
	if err := tally.Err(clusterBound); err != nil {
		t.Error(err)
	}
	if n, worst := dues.early(arrivals); n > 0 {
		t.Errorf("%d messages arrived early, the worst by %v", n, worst)
	}
	c.stopAll()
	return arrivals
}

// resumed is when releases resumed after failed: the end of the longest
// pause in the arrivals from failed on (from failed to the first arrival
// if that is the longest).
func resumed(arrivals []arrival, failed time.Time) time.Time {
	at := []time.Time{failed}
	for _, a := range arrivals {
		if a.At.After(failed) {
			at = append(at, a.At)
		}
	}
	slices.SortFunc(at, time.Time.Compare)
	end, longest := failed, time.Duration(0)
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap > longest {
			end, longest = at[i], gap
		}
	}
	return end
}

// delayedQueue declares a delayed fanout exchange through the first node,
// bound to a queue, waits until every node knows the exchange, and
// consumes the queue straight from RabbitMQ.
func (c *cluster) delayedQueue(t *testing.T) (exchange string, got *consumer) {
	t.Helper()
	ch := testbroker.Channel(t, c.nodes[0].tp.dial(t))
	ex, q := delayedQueue(t, ch, "fanout", "")
	c.awaitExchange(ex)
	return ex, consume(t, testbroker.Dial(t, testbroker.URL(t)), q)
}
