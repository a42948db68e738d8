package releaser

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store"
)

// live reports whether vhost has an open connection, and how many dials
// the Releaser made so far.
func (r *Releaser) live(vhost string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.conns[vhost]
	if c == nil {
		return false, r.dials
	}
	select {
	case <-c.dead:
		return false, r.dials
	default:
		return true, r.dials
	}
}

// awaitDials waits until the Releaser made at least n dials and vhost's
// connection is open (or not, as open says).
func awaitDials(t *testing.T, r *Releaser, vhost string, n int, open bool) {
	t.Helper()
	testwait.Until(t, 15*time.Second, fmt.Sprintf("%d dials, connection open %v", n, open), func() bool {
		ok, dials := r.live(vhost)
		return dials >= n && ok == open
	})
}

// TestAnIdleConnectionLostIsDialledAgain: when RabbitMQ closes an idle
// release connection, the Releaser dials it again by itself, so the next
// release goes out on a connection that is already open.
func TestAnIdleConnectionLostIsDialledAgain(t *testing.T) {
	f := newFixture(t, "direct")
	name := fmt.Sprintf("releaser-redial-%d", time.Now().UnixNano())
	var counts counts
	r := newReleaser(t, Config{Name: name, Metrics: &counts})
	if err := r.Ping(context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	if n := testbroker.CloseConnections(t, name); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	awaitDials(t, r, "/", 2, true) // no release asked for it
	if n := counts.reconnects.Load(); n != 1 {
		t.Fatalf("reconnects = %d, want 1", n)
	}
	if got := r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 10, properties(), "redialled")}); !got[0] {
		t.Fatal("release not confirmed")
	}
	if _, dials := r.live("/"); dials != 2 {
		t.Fatalf("%d dials, want 2: the release dialled again", dials)
	}
	if d := f.get(t); string(d.Body) != "redialled" {
		t.Fatalf("got %q", d.Body)
	}
}

// TestCloseEndsARedial: a release connection closed by RabbitMQ while
// idle, on a vhost the account has lost its permissions on, is dialled
// again, refused, and retried after a wait; Close ends that wait and
// leaves no goroutine behind.
func TestCloseEndsARedial(t *testing.T) {
	vhost := testbroker.VHost(t, "releaser-redial-")
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	name := fmt.Sprintf("releaser-redial-%d", time.Now().UnixNano())
	r, err := New(Config{URL: testbroker.URL(t), Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ping(context.Background(), vhost); err != nil {
		t.Fatal(err)
	}
	testbroker.Permit(t, vhost, false)
	if n := testbroker.CloseConnections(t, name); n != 1 {
		t.Fatalf("closed %d connections, want 1", n)
	}
	awaitDials(t, r, vhost, 3, false) // dialled again, refused, and again 200 ms later
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestWarmRetriesUntilLetIn: Warm on a vhost RabbitMQ refuses (no
// permissions yet) keeps dialling, and connects once it may, with no
// release asking.
func TestWarmRetriesUntilLetIn(t *testing.T) {
	vhost := testbroker.VHost(t, "releaser-warm-")
	testbroker.Permit(t, vhost, false)
	r := newReleaser(t, Config{})
	r.Warm(vhost)
	awaitDials(t, r, vhost, 2, false) // refused, and tried again
	testbroker.Permit(t, vhost, true)
	awaitDials(t, r, vhost, 3, true)
}
