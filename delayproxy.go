package delayproxy

// STAND-IN, to be replaced by the lead: this file wires only the operator
// side (store, metrics, admin HTTP server) so that the binary, the image and
// the probes can be exercised before the AMQP side lands. It has no AMQP
// listener, scheduler or releaser.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Proxy is one delayproxy instance.
type Proxy struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns a Proxy; nothing is opened until Run.
func New(cfg Config, logger *slog.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Proxy{cfg: cfg, log: logger}, nil
}

// Run opens the store and serves until ctx is cancelled, then shuts down
// within Config.ShutdownGrace.
func (p *Proxy) Run(ctx context.Context) (err error) {
	path, err := p.cfg.EnsureDataDir()
	if err != nil {
		return err
	}
	m := metrics.New()
	st, err := store.Open(path, store.Options{OnCommit: m.Commit})
	if err != nil {
		return fmt.Errorf("open store %s: %w", path, err)
	}
	defer func() { err = errors.Join(err, st.Close()) }()

	if err := m.RegisterStore(st, path); err != nil {
		return err
	}
	srv, err := admin.New(admin.Options{
		Addr:    p.cfg.HTTPAddr,
		Token:   p.cfg.AdminToken,
		Engine:  st, // the real wiring wraps store + scheduler (see admin.Engine)
		Metrics: m,
		Ready:   func(ctx context.Context) error { return dialUpstream(ctx, p.cfg.UpstreamURL) },
		Logger:  p.log,
	})
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	p.log.Info("delayproxy started (stand-in: admin HTTP only, no AMQP listener)",
		"version", VersionString(), "http", srv.Addr().String(), "pending", st.Pending(), "config", p.cfg)

	<-ctx.Done()
	p.log.Info("shutting down", "grace", p.cfg.ShutdownGrace.String())
	sctx, cancel := context.WithTimeout(context.Background(), p.cfg.ShutdownGrace)
	defer cancel()
	return srv.Shutdown(sctx)
}

// dialUpstream checks that RabbitMQ accepts TCP connections.
func dialUpstream(ctx context.Context, rawURL string) error {
	u, err := amqp.ParseURI(rawURL)
	if err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Host, fmt.Sprint(u.Port)))
	if err != nil {
		return fmt.Errorf("upstream unreachable: %w", err)
	}
	return c.Close()
}
