package amqpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testProxy is a Server listening on a loopback port in front of the test
// broker.
type testProxy struct {
	srv  *Server
	addr string
}

// testLogger discards logs unless DELAYPROXY_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("DELAYPROXY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startProxy starts a Server for the test; cfg.Upstream defaults to the
// test broker. The Server is closed in t.Cleanup, and Serve must return
// ErrServerClosed.
func startProxy(t testing.TB, cfg Config) *testProxy {
	t.Helper()
	if cfg.Upstream == "" {
		cfg.Upstream = testbroker.URL(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return &testProxy{srv: srv, addr: l.Addr().String()}
}

// url is the proxy's address with the broker's credentials and vhost.
func (p *testProxy) url(t testing.TB) string {
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr
	u.Scheme = "amqp"
	return u.String()
}

// dial connects an amqp091-go client through the proxy; closed in Cleanup.
func (p *testProxy) dial(t testing.TB, cfg amqp.Config) *amqp.Connection {
	t.Helper()
	c, err := amqp.DialConfig(p.url(t), cfg)
	if err != nil {
		t.Fatalf("dial through proxy: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialBroker connects straight to RabbitMQ; closed in Cleanup.
func dialBroker(t testing.TB) *amqp.Connection {
	t.Helper()
	c, err := amqp.Dial(testbroker.URL(t))
	if err != nil {
		t.Fatalf("dial broker: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func channel(t testing.TB, c *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

var nameSeq atomic.Uint64

// uniqueName is a queue or exchange name no other test (or run) uses.
func uniqueName(t testing.TB) string {
	n := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return fmt.Sprintf("dp-test.%s.%d.%d", n, time.Now().UnixNano(), nameSeq.Add(1))
}

// declareQueue declares a queue straight on the broker and deletes it in
// Cleanup.
func declareQueue(t testing.TB, args amqp.Table) string {
	t.Helper()
	name := uniqueName(t)
	conn := dialBroker(t)
	ch := channel(t, conn)
	if _, err := ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testbroker.DeleteQueue(t, name) })
	return name
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
