package e2e

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// Helpers of the reliability tests (issue 6). They build on the e2e harness
// (startProxy, consume, declareDelayed...) and on internal/crashtest.

// releaseWindow bounds the duplicates one fault may cause: the scheduler
// keeps at most 5×MaxInFlight keys out for release or awaiting their delete
// (scheduler package doc), and the proxy sets MaxInFlight to
// MaxReleasesInFlight. Each of them may have been enqueued by RabbitMQ and
// still be in the store when the proxy dies, or be published again when
// its confirm was lost with the connection.
const releaseWindow = 5 * delayproxy.MaxReleasesInFlight

// withHost returns rawURL (an AMQP URL) with its host:port replaced, and its
// vhost too when vhost is not "".
func withHost(t testing.TB, rawURL, hostport, vhost string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	if vhost != "" {
		u.Path, u.RawPath = "/"+vhost, "/"+url.PathEscape(vhost)
	}
	return u.String()
}

// withVHost returns rawURL with its vhost replaced.
func withVHost(t testing.TB, rawURL, vhost string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return withHost(t, rawURL, u.Host, vhost)
}

// delaySpread returns a Publisher's Delay: most messages due between lo
// and hi, one in seven between far and far+span. Deterministic in seq and
// salt, so a failing run's delays can be told from its log.
func delaySpread(salt uint64, lo, hi, far, span time.Duration) func(uint64) time.Duration {
	return func(seq uint64) time.Duration {
		h := (seq + salt*0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9
		h ^= h >> 31
		if h%7 == 0 {
			return far + time.Duration(h>>8)%span
		}
		return lo + time.Duration(h>>8)%(hi-lo)
	}
}

// spread is a delaySpread without its salt: most messages due between lo
// and hi, one in seven between far and far+span.
type spread struct{ lo, hi, far, span time.Duration }

// startClients starts n publishers (crashtest.StartPublishers) named
// "<prefix> <i>", each publishing rate messages a second to exchange
// through url, with delays spread by d salted by i.
func startClients(n int, prefix string, url func() string, exchange string, rate float64, d spread) *crashtest.Publishers {
	return crashtest.StartPublishers(n, func(i int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name:     fmt.Sprintf("%s %d", prefix, i),
			URL:      url,
			Exchange: exchange,
			Delay:    delaySpread(uint64(i), d.lo, d.hi, d.far, d.span),
			Rate:     rate,
		}
	})
}

// awaitConfirmedEach waits until each publisher has had n publishes
// confirmed.
func awaitConfirmedEach(t testing.TB, pubs *crashtest.Publishers, n int) {
	t.Helper()
	testwait.Until(t, 30*time.Second, "every client to have messages confirmed", func() bool {
		return pubs.Every(func(l crashtest.Ledger) bool { return len(l.Confirmed) >= n })
	})
}

// awaitEnds waits until every publisher has seen a connection of its end
// after since, failing the test at by, and returns each one's first such
// end.
func awaitEnds(t testing.TB, pubs *crashtest.Publishers, since, by time.Time) []crashtest.End {
	t.Helper()
	ends := make([]crashtest.End, len(pubs.All()))
	for i, p := range pubs.All() {
		testwait.Until(t, time.Until(by), fmt.Sprintf("client %d to see its connection closed", i), func() bool {
			for _, e := range p.Ledger().Ends {
				if e.At.After(since) {
					ends[i] = e
					return true
				}
			}
			return false
		})
	}
	return ends
}

// awaitDelivered polls c until every id the publishers' ledgers confirmed
// has arrived, failing the test after d with the number still missing.
func awaitDelivered(t testing.TB, c *consumer, pubs *crashtest.Publishers, d time.Duration) {
	t.Helper()
	awaitLedger(t, c, crashtest.Ledger{}, d, pubs.Ledgers()...)
}

// awaitLedger polls c until every id the ledgers confirmed has arrived,
// failing the test after d with the number still missing.
func awaitLedger(t testing.TB, c *consumer, l crashtest.Ledger, d time.Duration, more ...crashtest.Ledger) {
	t.Helper()
	ls := append([]crashtest.Ledger{l}, more...)
	deadline := time.Now().Add(d)
	for {
		got := map[string]int{}
		for _, a := range c.snapshot() {
			got[a.MessageId]++
		}
		missing := crashtest.Missing(ls, got)
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d confirmed messages still missing after %v", missing, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
