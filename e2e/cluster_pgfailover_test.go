package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestCluster_PrimaryFailover: two proxies on a PostgreSQL primary with a
// synchronous streaming standby (servers of the test's own), reached
// through a multi-host URL with target_session_attrs=read-write. The
// primary is killed while clients publish through both proxies with
// confirms, and the standby promoted: the proxies reconnect to it, and
// every confirmed message arrives, none early.
func TestCluster_PrimaryFailover(t *testing.T) {
	primary := newPGServer(t)
	standby := newPGStandby(t, primary)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%s,127.0.0.1:%s/postgres?target_session_attrs=read-write",
		primary.port, standby.port)
	c := startCluster(t, 2, url, "delayproxy")
	c.awaitHolder(-1, 15*time.Second)
	ch := testbroker.Channel(t, c.nodes[0].tp.dial(t))
	ex, q := delayedQueue(t, ch, "fanout", "")
	c.awaitExchange(ex)
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)

	var dues dueLedger
	tag := randHex(t, 4)
	pubs := crashtest.StartPublishers(4, func(i int) *crashtest.Publisher {
		name := fmt.Sprintf("dp-cluster-failover %s %d", tag, i)
		return &crashtest.Publisher{
			Name: name, URL: c.url, Exchange: ex, Window: 16, Rate: 100,
			Delay: dues.delay(name, delaySpread(uint64(i), 300*time.Millisecond, 3*time.Second, 5*time.Second, 3*time.Second)),
		}
	})
	awaitConfirmedEach(t, pubs, 100)
	atKill := pubs.Confirmed()
	primary.kill() // publishes in flight: committed on both, or not confirmed
	killed := time.Now()
	standby.promote()
	t.Logf("primary killed with %d confirmed; standby promoted %v later", atKill, time.Since(killed))

	carryOn(t, pubs, 50, 60*time.Second)
	t.Logf("every client has 50 more publishes confirmed %v after the kill", time.Since(killed))
	ls := pubs.Stop()
	awaitDelivered(t, got, pubs, 60*time.Second)
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
}
