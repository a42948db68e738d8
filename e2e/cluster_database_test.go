package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
)

// TestCluster_DatabaseFails: two proxies on PostgreSQL servers of the
// test's own, while clients publish delayed messages with confirms
// through both:
//
//   - restart: the one server stopped (pg_ctl stop -m fast) for 3 s, then
//     started; publishes are nacked or wait meanwhile, never confirmed
//     unstored, and release resumes;
//   - primary failover: a primary with a synchronous streaming standby,
//     reached through a multi-host URL with target_session_attrs=read-write;
//     the primary killed with publishes in flight (committed on both, or
//     not confirmed) and the standby promoted; the proxies reconnect to it.
//
// Every client carries on, and every confirmed message arrives, none early,
// duplicates within the bound.
func TestCluster_DatabaseFails(t *testing.T) {
	tests := []struct {
		name string
		// servers makes the test's servers: the URL the proxies use, and
		// what makes the database fail and recover, returning when it
		// is back.
		servers func(t *testing.T) (url string, fail func(t *testing.T))
	}{
		{"restart", func(t *testing.T) (string, func(*testing.T)) {
			pg := newPGServer(t)
			return pg.URL(), func(t *testing.T) {
				pg.stop()
				down := time.Now()
				time.Sleep(3 * time.Second)
				pg.start()
				t.Logf("PostgreSQL down for %v", time.Since(down))
			}
		}},
		{"primary failover", func(t *testing.T) (string, func(*testing.T)) {
			primary := newPGServer(t)
			standby := newPGStandby(t, primary)
			url := fmt.Sprintf("postgres://postgres@127.0.0.1:%s,127.0.0.1:%s/postgres?target_session_attrs=read-write",
				primary.port, standby.port)
			return url, func(t *testing.T) {
				primary.kill()
				killed := time.Now()
				standby.promote()
				t.Logf("standby promoted %v after the kill", time.Since(killed))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, fail := tt.servers(t)
			c := startCluster(t, 2, url, "delayproxy")
			c.awaitSpread(15 * time.Second)
			ex, got := c.delayedQueue(t)

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
			t.Logf("the database fails with %d confirmed", pubs.Confirmed())
			failed := time.Now()
			fail(t)
			carryOn(t, pubs, 50, 60*time.Second)
			t.Logf("every client has 50 more publishes confirmed %v after the failure", time.Since(failed))
			c.finish(t, got, pubs, &dues, 60*time.Second)
		})
	}
}
