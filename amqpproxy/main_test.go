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

// testProxy is a Server listening on a loopback port in front of a test
// broker.
type testProxy struct {
	srv    *Server
	addr   string
	broker testbroker.Broker // whose credentials and vhost clients use
}

// startProxy starts a Server for the test in front of the default broker
// (startProxyOn).
func startProxy(t testing.TB, cfg Config) *testProxy {
	t.Helper()
	return startProxyOn(t, testbroker.Default(t), cfg)
}

// startProxyOn starts a Server for the test; cfg.Upstream defaults to b.
// The Server is closed in t.Cleanup, and Serve must return ErrServerClosed.
func startProxyOn(t testing.TB, b testbroker.Broker, cfg Config) *testProxy {
	t.Helper()
	if cfg.Upstream == "" {
		cfg.Upstream = b.URL
	}
	if cfg.Logger == nil {
		cfg.Logger = testlog.New()
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testProxy{srv: srv, addr: testserver.Serve(t, srv, ErrServerClosed), broker: b}
}

// url is the proxy's address with the broker's credentials and vhost.
func (p *testProxy) url(t testing.TB) string {
	u, err := url.Parse(p.broker.URL)
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

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
