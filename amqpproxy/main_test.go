package amqpproxy

import (
	"context"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/testserver"
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

// startProxy starts a Server for the test; cfg.Upstream defaults to the
// test broker. The Server is closed in t.Cleanup, and Serve must return
// ErrServerClosed.
func startProxy(t testing.TB, cfg Config) *testProxy {
	t.Helper()
	if cfg.Upstream == "" {
		cfg.Upstream = testbroker.URL(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = testlog.New()
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testProxy{srv: srv, addr: testserver.Serve(t, srv, ErrServerClosed)}
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
	return testbroker.Dial(t, testbroker.URL(t))
}

// declareQueue declares a queue straight on the broker and deletes it in
// Cleanup.
func declareQueue(t testing.TB, args amqp.Table) string {
	t.Helper()
	name := testbroker.UniqueName(t, "q")
	conn := dialBroker(t)
	ch := testbroker.Channel(t, conn)
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
