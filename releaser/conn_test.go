package releaser

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testforward"
	"github.com/delayproxy/delayproxy/internal/testserver"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store"
)

func TestNegotiateHeartbeat(t *testing.T) {
	tests := []struct {
		offer uint16
		want  time.Duration
		got   uint16
	}{
		{60, 10 * time.Second, 10},          // RabbitMQ's default offer, our default
		{5, 10 * time.Second, 5},            // RabbitMQ's shorter offer wins
		{0, 10 * time.Second, 10},           // RabbitMQ offers none: ours
		{60, 1500 * time.Millisecond, 2},    // rounded up to whole seconds
		{60, 200 * 24 * time.Hour, 60},      // more than a uint16 of seconds
		{0, 200 * 24 * time.Hour, 0xffff},   // capped
		{30, 100 * time.Millisecond, 1},     // at least a second
		{7, 7 * time.Second, 7},             // equal
		{65535, 65535 * time.Second, 65535}, // the largest
	}
	for _, tt := range tests {
		if got := negotiateHeartbeat(tt.offer, tt.want); got != tt.got {
			t.Errorf("negotiateHeartbeat(%d, %v) = %d, want %d", tt.offer, tt.want, got, tt.got)
		}
	}
}

// TestHeartbeatsKeepAnIdleConnection: the connection takes the heartbeat
// asked for and sends heartbeats, so RabbitMQ keeps an idle connection
// open past two intervals, and it stays the one releases go out on.
func TestHeartbeatsKeepAnIdleConnection(t *testing.T) {
	f := newFixture(t, "direct")
	var m counts
	r := newReleaser(t, Config{Heartbeat: time.Second, Metrics: &m})
	if err := r.Ping(context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	c := r.conns["/"]
	r.mu.Unlock()
	if c.heartbeat != time.Second {
		t.Fatalf("heartbeat %v, want 1s", c.heartbeat)
	}
	time.Sleep(3500 * time.Millisecond) // RabbitMQ drops a silent client after two intervals
	select {
	case <-c.dead:
		t.Fatalf("idle connection ended: %v", c.err)
	default:
	}
	if got := r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 1, properties(), "idle")}); !got[0] {
		t.Fatal("release after idling not confirmed")
	}
	r.mu.Lock()
	dials := r.dials
	r.mu.Unlock()
	if dials != 1 || m.reconnects.Load() != 0 {
		t.Fatalf("%d dials, %d reconnects: the idle connection was lost", dials, m.reconnects.Load())
	}
	if d := f.get(t); string(d.Body) != "idle" {
		t.Fatalf("got %q", d.Body)
	}
}

// TestCloseLeavesNoGoroutines: Close waits for every goroutine the
// Releaser started: Warm's dials and each connection's reader and
// heartbeat.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	url := testbroker.URL(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r, err := New(Config{URL: url, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ping(context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	r.Warm("/", "/", "no-such-vhost-"+t.Name())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Ping(context.Background(), "/"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close = %v, want ErrClosed", err)
	}
	if got := r.Release(context.Background(), []*store.Message{{VHost: "/", Exchange: "x", Properties: properties()}}); got[0] {
		t.Fatal("confirmed after Close")
	}
}

// TestDialRefusals: RabbitMQ's refusals come back as its errors, with the
// reply codes it sent.
func TestDialRefusals(t *testing.T) {
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	badPass := *u
	badPass.User = url.UserPassword(u.User.Username(), "not-the-password")
	tests := []struct {
		name, url, vhost string
		code             uint16
	}{
		{"a wrong password", badPass.String(), "/", wire.AccessRefused},
		{"a vhost that does not exist", u.String(), "no-such-vhost", wire.NotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(Config{URL: tt.url})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			err = r.Ping(context.Background(), tt.vhost)
			var e *wire.Error
			if !errors.As(err, &e) || e.Code != tt.code {
				t.Fatalf("Ping = %v, want reply code %d", err, tt.code)
			}
		})
	}
}

// TestDialEndsWithItsContext: a dial stops when its context ends.
func TestDialEndsWithItsContext(t *testing.T) {
	r := newReleaser(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Ping(ctx, "/"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping with an ended context = %v", err)
	}
}

func TestNewRefusesAnUnknownDelayType(t *testing.T) {
	if _, err := New(Config{URL: "amqp://localhost/", DelayType: "int16"}); err == nil {
		t.Fatal("New accepted x-delay type int16")
	}
	if _, err := New(Config{URL: "http://localhost/"}); err == nil {
		t.Fatal("New accepted an http URL")
	}
}

// TestASlowDialHoldsUpNoOtherVHost: while the dial of one vhost hangs (its
// connection held before it reaches RabbitMQ), releases to a vhost already
// connected go out; the held dial completes once let through.
func TestASlowDialHoldsUpNoOtherVHost(t *testing.T) {
	f := newFixture(t, "direct")
	vhost := testbroker.VHost(t, "releaser-slow-dial-")
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	fw := testforward.Start(t, testserver.Listen(t), u.Host)
	u.Host = fw.Addr()
	r := newReleaser(t, Config{URL: u.String(), DialTimeout: time.Minute})
	if err := r.Ping(context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	fw.Hold()
	r.Warm(vhost)
	testwait.Until(t, 10*time.Second, "the new vhost's dial to be held", func() bool { return fw.Held() == 1 })
	released := make(chan bool, 1)
	go func() {
		released <- r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 10, properties(), "meanwhile")})[0]
	}()
	select {
	case ok := <-released:
		if !ok {
			t.Fatal("release not confirmed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the release waited for another vhost's dial")
	}
	if n := fw.Held(); n != 1 {
		t.Fatalf("%d dials held, want 1: the release went out once the dial ended", n)
	}
	fw.Let()
	awaitDials(t, r, vhost, 2, true)
	if d := f.get(t); string(d.Body) != "meanwhile" {
		t.Fatalf("got %q", d.Body)
	}
}
