package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestCluster_PostgreSQLRestart: two proxies on a PostgreSQL server of the
// test's own, restarted while clients publish through both. Publishes are
// nacked or wait while it is down, never confirmed unstored; every
// confirmed message arrives, none early; release resumes.
func TestCluster_PostgreSQLRestart(t *testing.T) {
	pg := newPGServer(t)
	c := startCluster(t, 2, pg.URL(), "delayproxy")
	c.awaitHolder(-1, 15*time.Second)
	ch := testbroker.Channel(t, c.nodes[0].tp.dial(t))
	ex, q := delayedQueue(t, ch, "fanout", "")
	c.awaitExchange(ex)
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)

	var dues dueLedger
	tag := randHex(t, 4)
	pubs := crashtest.StartPublishers(4, func(i int) *crashtest.Publisher {
		name := fmt.Sprintf("dp-cluster-pg %s %d", tag, i)
		return &crashtest.Publisher{
			Name: name, URL: c.url, Exchange: ex, Window: 16, Rate: 100,
			Delay: dues.delay(name, delaySpread(uint64(i), 300*time.Millisecond, 3*time.Second, 5*time.Second, 3*time.Second)),
		}
	})
	awaitConfirmedEach(t, pubs, 100)
	pg.stop()
	down := time.Now()
	time.Sleep(3 * time.Second)
	pg.start()
	up := time.Now()
	t.Logf("PostgreSQL down for %v", up.Sub(down))

	carryOn(t, pubs, 50, 60*time.Second)
	t.Logf("every client has 50 more publishes confirmed %v after the restart", time.Since(up))
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
