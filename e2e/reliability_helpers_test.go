package delayproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os/exec"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// Helpers of the reliability tests (issue 6). They build on the e2e harness
// (startProxy, consume, declareDelayed...) and on internal/crashtest.

// releaseWindow bounds the duplicates one fault may cause: the scheduler
// keeps at most 5×MaxInFlight keys out for release or awaiting their delete
// (scheduler package doc), and the proxy sets MaxInFlight to
// MaxReleasesInFlight. Each of them may have been enqueued by RabbitMQ and
// still be in the store when the proxy dies, or be published again when
// its confirm was lost with the connection.
const releaseWindow = 5 * MaxReleasesInFlight

// randomTag is 8 hex digits, to tell this run's connections, vhosts and
// message-ids from any other's.
func randomTag(t testing.TB) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

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

// testVHost creates a vhost of its own for the test, on which the broker's
// user may do everything, and deletes it in t.Cleanup. The proxy's releaser
// names its connection after the vhost ("delayproxy releaser <vhost>"), so
// a test can close its own proxy's releaser connection and no other.
func testVHost(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	vh := "dp-rel-" + randomTag(t)
	ctl := func(args ...string) error {
		out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("rabbitmqctl %v: %v\n%s", args, err, out)
		}
		return nil
	}
	if err := ctl("add_vhost", vh); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctl("delete_vhost", vh); err != nil {
			t.Error(err)
		}
	})
	if err := ctl("set_permissions", "-p", vh, user, ".*", ".*", ".*"); err != nil {
		t.Fatal(err)
	}
	return vh
}

// brokerSetup runs f on a channel straight to RabbitMQ at brokerURL and
// fails the test on error.
func brokerSetup(t testing.TB, brokerURL string, f func(*amqp.Channel) error) {
	t.Helper()
	c, err := amqp.Dial(brokerURL)
	if err != nil {
		t.Fatalf("dial %s: %v", redactURL(brokerURL), err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := f(ch); err != nil {
		t.Fatal(err)
	}
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

// publishers runs n Publishers named prefix-0 ... prefix-(n-1) until the
// returned stop is called; stop returns their ledgers once every Run
// returned.
func runPublishers(n int, mk func(i int) *crashtest.Publisher) (pubs []*crashtest.Publisher, stop func() []crashtest.Ledger) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		p := mk(i)
		pubs = append(pubs, p)
		wg.Go(func() { p.Run(ctx) })
	}
	return pubs, func() []crashtest.Ledger {
		cancel()
		wg.Wait()
		ls := make([]crashtest.Ledger, len(pubs))
		for i, p := range pubs {
			ls[i] = p.Ledger()
		}
		return ls
	}
}

// confirmedSoFar sums the publishers' confirmed counts.
func confirmedSoFar(pubs []*crashtest.Publisher) int {
	n := 0
	for _, p := range pubs {
		n += len(p.Ledger().Confirmed)
	}
	return n
}

// ledgers reads the publishers' ledgers as they are now.
func ledgers(pubs []*crashtest.Publisher) []crashtest.Ledger {
	ls := make([]crashtest.Ledger, len(pubs))
	for i, p := range pubs {
		ls[i] = p.Ledger()
	}
	return ls
}

// messageIDs are the message-ids of arrivals, in arrival order.
func messageIDs(as []arrival) []string {
	ids := make([]string, len(as))
	for i, a := range as {
		ids[i] = a.MessageId
	}
	return ids
}

// awaitDelivered polls c until every id the publishers' ledgers confirmed
// has arrived, failing the test after d with the number still missing.
func awaitDelivered(t testing.TB, c *consumer, pubs []*crashtest.Publisher, d time.Duration) {
	t.Helper()
	awaitLedger(t, c, crashtest.Ledger{}, d, ledgers(pubs)...)
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
