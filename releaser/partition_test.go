//go:build linux

package releaser

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/netns"
	"github.com/delayproxy/delayproxy/store"
)

// TestSilentRabbitMQ: the releaser reaches RabbitMQ across a link that is
// then cut (internal/netns: every packet dropped, no reset). The
// connection ends two heartbeat intervals after RabbitMQ's last byte, not
// later, and a release awaiting its confirm is reported unconfirmed; once
// the link is back, the next release goes out on a new connection.
//
// The last byte (the confirm of a release) arrives just after the
// heartbeat goroutine woke, the worst case for a check every half
// interval, which would find the silence only 2.5 intervals after it
// began.
func TestSilentRabbitMQ(t *testing.T) {
	const heartbeat = time.Second
	f := newFixture(t, "direct")
	u, err := amqp.ParseURI(f.url)
	if err != nil {
		t.Fatal(err)
	}
	link := netns.New(t)
	across, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	across.Host = link.Forward(t, net.JoinHostPort(u.Host, strconv.Itoa(u.Port)))
	r, err := New(Config{URL: across.String(), Heartbeat: heartbeat})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	release := func(body string) bool {
		return r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 1, properties(), body)})[0]
	}
	if !release("before") {
		t.Fatal("release before the cut not confirmed")
	}
	r.mu.Lock()
	c := r.conns["/"]
	r.mu.Unlock()

	// Just after a half-interval tick of the heartbeat goroutine (they
	// fall at born + k*heartbeat/2 while nothing else wakes it)...
	half := heartbeat / 2
	time.Sleep(half - time.Since(c.born)%half + 20*time.Millisecond)
	if !release("last") { // ... the last bytes from RabbitMQ: its confirm
		t.Fatal("release just before the cut not confirmed")
	}
	link.Cut(t)
	unconfirmed, _ := r.Publish(context.Background(), []*store.Message{message(f.exchange, "k", 1, properties(), "lost")})
	select {
	case <-c.dead:
	case <-time.After(4 * heartbeat):
		t.Fatalf("connection still up %v after RabbitMQ went silent", 4*heartbeat)
	}
	silent := time.Since(c.born) - time.Duration(c.lastRead.Load())
	t.Logf("heartbeat %v: connection ended after %v of silence: %v", heartbeat, silent.Round(time.Millisecond), c.err)
	if silent > 2*heartbeat+heartbeat/5 {
		t.Errorf("connection ended after %v of silence, want two intervals (%v)", silent.Round(time.Millisecond), 2*heartbeat)
	}
	if unconfirmed()[0] {
		t.Error("a release written into the silence was reported confirmed")
	}

	link.Restore(t)
	if !release("after") {
		t.Fatal("release after the link came back not confirmed")
	}
	// "lost" may arrive too: the closed socket's kernel sends what it
	// held once the link is back, if RabbitMQ still has that connection.
	for _, want := range []string{"before", "last", "after"} {
		d := f.get(t)
		if string(d.Body) == "lost" && want == "after" {
			d = f.get(t)
		}
		if string(d.Body) != want {
			t.Fatalf("got %q, want %q", d.Body, want)
		}
	}
}
