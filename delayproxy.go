package delayproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/amqpurl"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/releaser"
	"github.com/delayproxy/delayproxy/scheduler"
	"github.com/delayproxy/delayproxy/store"
)

// Proxy is one delayproxy instance: the AMQP listener, the delay engine
// (store, scheduler, releaser) and the HTTP server.
type Proxy struct {
	cfg Config
	log *slog.Logger
	// clock is the wall clock delayed publishes are timed by and the
	// scheduler releases by (WithClock); nil is the system clock.
	clock scheduler.Clock

	ready chan struct{} // closed once Run listens on every address

	mu       sync.Mutex // guards amqpAddr and httpAddr
	amqpAddr net.Addr
	httpAddr net.Addr
}

// Option changes how New builds a Proxy.
type Option func(*Proxy)

// WithClock times delayed publishes and their releases by clock instead of
// the system clock: the wall clock a due time is computed from (now +
// x-delay) and the scheduler releases by. Tests freeze it and move it.
func WithClock(clock scheduler.Clock) Option {
	return func(p *Proxy) { p.clock = clock }
}

// New checks cfg and returns a Proxy; nothing is opened until Run.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	p := &Proxy{cfg: cfg, log: logger, ready: make(chan struct{})}
	for _, opt := range opts {
		opt(p)
	}
	return p, nil
}

// Ready is closed once Run has opened the store and listens.
func (p *Proxy) Ready() <-chan struct{} { return p.ready }

// Addrs are the AMQP and HTTP listen addresses, once Ready.
func (p *Proxy) Addrs() (amqpAddr, httpAddr net.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.amqpAddr, p.httpAddr
}

// Run serves until ctx is cancelled, then shuts down gracefully within
// Config.ShutdownGrace: it stops accepting, closes client connections with
// 320 CONNECTION_FORCED, stores every delayed publish already read, lets
// in-flight releases finish, and closes the store. Nothing confirmed is lost
// whichever way it stops: confirmed messages are on disk.
func (p *Proxy) Run(ctx context.Context) (err error) {
	m := metrics.New()
	ann := &lateAnnouncer{}
	opened, err := p.openStore(ctx, m, ann)
	if err != nil {
		return err
	}
	st := opened.Store
	defer func() { err = errors.Join(err, st.Close()) }()
	if err := m.RegisterStore(opened.metrics, opened.path); err != nil {
		return err
	}

	// The releaser declares a missing real exchange again from the
	// registry, but not one a client is deleting (icpt.Lookup); icpt needs
	// the scheduler, which needs the releaser, and is set before the
	// scheduler runs.
	var icpt *delayed.Interceptor
	rel, err := releaser.New(releaser.Config{
		URL:       p.cfg.ReleaseAccountURL(),
		DelayType: releaser.DelayType(p.cfg.ReleasedDelayType),
		Registry:  registryFunc(func(vhost, name string) (store.ExchangeDef, bool) { return icpt.Lookup(vhost, name) }),
		Metrics:   m,
		Logger:    p.log.With("room", "releaser"),
	})
	if err != nil {
		return err
	}
	defer rel.Close()
	rel.Warm(vhostsOf(st.Exchanges())...)

	var now func() time.Time // nil: time.Now
	if p.clock != nil {
		now = p.clock.Now
	}
	first := newReleasesFirst(p.cfg.ReleasesFirst, now)
	if err := first.register(m); err != nil {
		return err
	}
	sched, err := p.newReleasing(ctx, st, opened.pg, rel, m, first.schedulerMetrics(m))
	if err != nil {
		return err
	}
	if a, ok := sched.(announcer); ok {
		ann.set(a)
	}
	if err := m.RegisterBacklog(sched); err != nil {
		return err
	}
	icpt = delayed.New(delayed.Config{
		Store:               warmingStore{Store: st, warm: func(vhost string) { rel.Warm(vhost) }},
		Scheduler:           sched,
		MaxDelay:            p.cfg.MaxDelay,
		ReleaseWindow:       p.cfg.ReleaseWindow,
		DeliveryTimeHeaders: p.cfg.DeliveryTimeHeaders,
		Intake:              first.intake(),
		Now:                 now,
		Metrics:             m,
		Logger:              p.log.With("room", "delayed"),
	})
	srv, err := amqpproxy.New(amqpproxy.Config{
		Upstream:         p.cfg.UpstreamURL,
		CertFile:         p.cfg.TLSCert,
		KeyFile:          p.cfg.TLSKey,
		Interceptor:      icpt,
		HandshakeTimeout: p.cfg.HandshakeTimeout,
		Heartbeat:        p.cfg.Heartbeat,
		MaxMessageSize:   int(p.cfg.MaxMessageSize),
		Logger:           p.log.With("room", "amqpproxy"),
		Version:          VersionString(),
		Metrics:          m,
	})
	if err != nil {
		return err
	}
	web, err := admin.New(admin.Options{
		Addr:    p.cfg.HTTPAddr,
		Token:   p.cfg.AdminToken,
		Engine:  engine{Store: st, sched: sched},
		Metrics: m,
		// The store is open for as long as the HTTP server runs (it closes
		// after web.Shutdown), so readiness is RabbitMQ being reachable.
		Ready:   func(ctx context.Context) error { return dialUpstream(ctx, p.cfg.UpstreamURL) },
		Logger:  p.log.With("room", "admin"),
		Version: VersionString(),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", p.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", p.cfg.ListenAddr, err)
	}
	if err := web.Start(); err != nil {
		ln.Close()
		return err
	}

	schedCtx, stopSched := context.WithCancel(context.Background())
	defer stopSched()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := sched.Run(schedCtx); err != nil && !errors.Is(err, context.Canceled) {
			errc <- fmt.Errorf("scheduler: %w", err)
		}
	})
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, amqpproxy.ErrServerClosed) {
			errc <- fmt.Errorf("amqp listener: %w", err)
		}
	})

	p.mu.Lock()
	p.amqpAddr, p.httpAddr = ln.Addr(), web.Addr()
	p.mu.Unlock()
	close(p.ready)
	p.log.Info("delayproxy started", "version", VersionString(), "amqp", ln.Addr().String(),
		"http", web.Addr().String(), "upstream", redactURL(p.cfg.UpstreamURL), "store", opened.where, "pending", st.Pending())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		p.log.Error("stopping", "err", runErr)
	}
	p.log.Info("shutting down", "grace", p.cfg.ShutdownGrace.String())
	sctx, cancel := context.WithTimeout(context.Background(), p.cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		p.log.Warn("client connections closed at once after the grace period", "err", err)
	}
	icpt.Wait() // every delayed publish already read is stored and answered
	stopSched()
	wg.Wait() // the scheduler has seen its in-flight releases answered
	shutdownErr := web.Shutdown(sctx)
	p.log.Info("stopped", "pending", st.Pending())
	return errors.Join(runErr, shutdownErr)
}

// dialUpstream checks that RabbitMQ accepts TCP connections.
func dialUpstream(ctx context.Context, rawURL string) error {
	up, err := amqpurl.Parse(rawURL, nil)
	if err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", up.HostPort)
	if err != nil {
		return fmt.Errorf("upstream unreachable: %w", err)
	}
	return c.Close()
}

// MaxReleasesInFlight is the most releases published and not yet confirmed by
// RabbitMQ. It bounds the duplicates a crash can cause (at-least-once).
const MaxReleasesInFlight = 4096

// ReleaseDeleteLinger is how long released messages wait before they are
// deleted from the store, so that one commit (one fsync) deletes many. A
// crash releases them again (invariant 2): at most 5×MaxReleasesInFlight.
// docs/scheduler.md has the measurements behind the value.
const ReleaseDeleteLinger = 20 * time.Millisecond

// registryFunc is a registry lookup as the releaser takes it.
type registryFunc func(vhost, name string) (store.ExchangeDef, bool)

// Exchange looks the delayed exchange up.
func (f registryFunc) Exchange(vhost, name string) (store.ExchangeDef, bool) { return f(vhost, name) }

// vhostsOf lists the distinct vhosts of the delayed exchanges.
func vhostsOf(defs []store.ExchangeDef) []string {
	seen := map[string]bool{}
	var out []string
	for _, d := range defs {
		if !seen[d.VHost] {
			seen[d.VHost] = true
			out = append(out, d.VHost)
		}
	}
	return out
}
