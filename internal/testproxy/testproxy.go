// Package testproxy runs whole delayproxy instances (delayproxy.New and
// Run, in the test's process) in front of the test broker, for the
// end-to-end tests and the benchmarks.
package testproxy

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// Config is delayproxy.DefaultConfig for a test: both listeners on
// loopback ports, the test broker upstream, a data dir of the test's, and
// a 10 s shutdown grace.
func Config(t testing.TB) delayproxy.Config {
	t.Helper()
	cfg := delayproxy.DefaultConfig()
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.UpstreamURL = testbroker.URL(t)
	cfg.DataDir = t.TempDir()
	cfg.ShutdownGrace = 10 * time.Second
	return cfg
}

// readyTimeout is how long Start waits for a Proxy to listen.
const readyTimeout = 30 * time.Second

// Running is a Proxy whose Run goroutine Start started.
type Running struct {
	cancel  context.CancelFunc
	done    chan error // Run's result
	amqpURL string
	httpURL string
}

// Start runs a Proxy with cfg, logger and opts until Stop, and returns once
// it listens. It fails the test if New fails, or if Run returns before the
// Proxy is ready or it is not ready within 30 s.
func Start(t testing.TB, cfg delayproxy.Config, logger *slog.Logger, opts ...delayproxy.Option) *Running {
	t.Helper()
	p, err := delayproxy.New(cfg, logger, opts...)
	if err != nil {
		t.Fatalf("delayproxy.New: %v", err)
	}
	u, err := url.Parse(cfg.UpstreamURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-r.done:
		cancel()
		t.Fatalf("Run returned before it was ready: %v", err)
	case <-time.After(readyTimeout):
		cancel()
		t.Fatalf("proxy not ready after %v", readyTimeout)
	}
	amqpAddr, httpAddr := p.Addrs()
	u.Scheme, u.Host = "amqp", amqpAddr.String()
	r.amqpURL, r.httpURL = u.String(), "http://"+httpAddr.String()
	return r
}

// URL is the proxy's AMQP URL, with the upstream's credentials and vhost.
func (r *Running) URL() string { return r.amqpURL }

// HTTP is the base URL of the proxy's admin and metrics server.
func (r *Running) HTTP() string { return r.httpURL }

// Stop cancels Run's context and returns Run's result; it fails the test
// if Run has not returned within timeout.
func (r *Running) Stop(t testing.TB, timeout time.Duration) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return %v after its context ended", timeout)
		return nil
	}
}
