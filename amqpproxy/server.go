package amqpproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/amqpurl"
)

// Config configures a Server. Zero values take the defaults noted.
type Config struct {
	// Upstream is RabbitMQ's URL, amqp://host:port or amqps://host:port.
	// Credentials and vhost in it are ignored: clients log in as themselves.
	Upstream string
	// UpstreamTLS is the TLS configuration for amqps:// (root CAs, client
	// certificates); nil uses the system roots. ServerName defaults to the
	// URL's host.
	UpstreamTLS *tls.Config

	// TLS, when set, makes the listener speak TLS with these certificates.
	TLS *tls.Config
	// CertFile and KeyFile, when both set (and TLS is nil), are loaded as
	// the listener's certificate.
	CertFile, KeyFile string

	// Interceptor takes part in chosen traffic; nil relays everything.
	Interceptor Interceptor

	// HandshakeTimeout bounds the time from accept to connection.open-ok
	// (default 10 s, RabbitMQ's).
	HandshakeTimeout time.Duration
	// Heartbeat is the heartbeat interval (whole seconds) proposed to
	// clients in connection.tune instead of RabbitMQ's; 0 proposes none.
	// The client's tune-ok applies to both hops, so they always agree.
	Heartbeat time.Duration
	// DialTimeout bounds connecting to RabbitMQ (default 5 s).
	DialTimeout time.Duration
	// CloseTimeout bounds waiting for a close-ok, and writing what is queued
	// when a connection ends (default 3 s).
	CloseTimeout time.Duration
	// WriteQueueBytes bounds each writer's queue of relayed frames; a reader
	// that finds it full stops reading until there is room (default 256 KiB).
	WriteQueueBytes int
	// MaxMessageSize bounds the body of a publish the interceptor assembles
	// (default 128 MiB, RabbitMQ's max_message_size).
	MaxMessageSize int

	// Version is advertised to clients as the one server property the
	// proxy adds to RabbitMQ's in connection.start, "delayproxy"; empty
	// adds none.
	Version string

	// Logger receives the proxy's logs (default slog.Default()).
	Logger *slog.Logger
	// Metrics receives the relay's counts (default: none).
	Metrics Metrics
}

// Metrics receives the relay's counts. The calls are cheap and few:
// connections and channels as they open and close, relayed traffic once
// per writer flush.
type Metrics interface {
	// ConnOpened: a client connection completed its handshake.
	ConnOpened()
	// ConnClosed: a connection counted by ConnOpened ended.
	ConnClosed()
	// ChannelsOpened adds delta (negative when channels close) to the
	// number of open client channels.
	ChannelsOpened(delta int)
	// Relayed counts frames and bytes relayed from the client to RabbitMQ
	// (toUpstream) or back.
	Relayed(toUpstream bool, frames, bytes int)
	// AcksFolded counts consumer acks sent to RabbitMQ inside the next
	// ack on the same channel (multiple set) instead of on their own.
	AcksFolded(n int)
	// PublishTooLarge: a publish the Interceptor claimed was refused for a
	// body above MaxMessageSize.
	PublishTooLarge()
}

type noMetrics struct{}

func (noMetrics) ConnOpened()            {}
func (noMetrics) ConnClosed()            {}
func (noMetrics) ChannelsOpened(int)     {}
func (noMetrics) Relayed(bool, int, int) {}
func (noMetrics) AcksFolded(int)         {}
func (noMetrics) PublishTooLarge()       {}

// Server accepts AMQP 0-9-1 clients and relays each one to its own
// connection to RabbitMQ.
type Server struct {
	cfg Config
	up  amqpurl.Endpoint // RabbitMQ; its user and password are not used: each client logs in with its own
	log *slog.Logger
	tls *tls.Config

	fallbackProps wire.Table // server properties when RabbitMQ cannot be reached

	ctx    context.Context // canceled by Close: ends dials in progress
	cancel context.CancelFunc

	mu        sync.Mutex // guards listeners, sessions, closed
	listeners map[net.Listener]struct{}
	sessions  map[*session]struct{}
	closed    bool

	wg     sync.WaitGroup // every connection handler
	nextID atomic.Uint64

	// beforeRelay, when set (tests), runs between a connection's handshake
	// and its relay.
	beforeRelay func(*session)
}

// ErrServerClosed is returned by Serve and ListenAndServe after Close or
// Shutdown.
var ErrServerClosed = errors.New("amqpproxy: server closed")

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 3 * time.Second
	}
	if cfg.WriteQueueBytes <= 0 {
		cfg.WriteQueueBytes = 256 << 10
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 128 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	up, err := amqpurl.Parse(cfg.Upstream, cfg.UpstreamTLS)
	if err != nil {
		return nil, fmt.Errorf("amqpproxy: upstream %w", err)
	}
	tlsConf := cfg.TLS
	if tlsConf == nil && (cfg.CertFile != "" || cfg.KeyFile != "") {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("amqpproxy: listener certificate: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, up: up, log: cfg.Logger, tls: tlsConf, fallbackProps: fallbackProperties(cfg.Version),
		ctx: ctx, cancel: cancel,
		listeners: map[net.Listener]struct{}{}, sessions: map[*session]struct{}{}}, nil
}

// ListenAndServe listens on addr (TCP, TLS when configured) and serves.
func (srv *Server) ListenAndServe(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return srv.Serve(l)
}

// Serve accepts connections on l until Close or Shutdown, and then returns
// ErrServerClosed. Connections are wrapped in TLS when the Server has a
// certificate. Serve closes l.
func (srv *Server) Serve(l net.Listener) error {
	srv.mu.Lock()
	if srv.closed {
		srv.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	srv.listeners[l] = struct{}{}
	srv.mu.Unlock()
	defer func() {
		srv.mu.Lock()
		delete(srv.listeners, l)
		srv.mu.Unlock()
		l.Close()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if srv.isClosed() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				srv.log.Warn("accept failed, retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		srv.start(c)
	}
}

// isTemporary reports accept errors worth retrying (too many open files
// and the like).
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (srv *Server) isClosed() bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.closed
}

// start registers and runs the handler of one accepted connection.
func (srv *Server) start(c net.Conn) {
	setNoDelay(c)
	id := srv.nextID.Add(1)
	s := &session{srv: srv, done: make(chan struct{}), drainSig: make(chan struct{}, 1), handshook: make(chan struct{}), probe: newProber(),
		log: srv.log.With("conn", id, "client", c.RemoteAddr().String())}
	s.ctx, s.cancel = context.WithCancel(srv.ctx)
	s.clientConn = c
	if srv.cfg.Interceptor != nil {
		// Only publishes handed to the hooks carry a receive time: a pure
		// relay reads with plain reads and leaves the host's timestamping off.
		s.clientConn, s.recv = withRecvTime(c)
	}
	if srv.tls != nil {
		s.clientConn = tls.Server(s.clientConn, srv.tls)
	}
	s.client = &readTimer{Conn: s.clientConn}
	s.cr = wire.NewReader(s.client, preTuneFrameMax)
	s.info = &Conn{RemoteAddr: c.RemoteAddr(), s: s}
	srv.mu.Lock()
	if srv.closed {
		srv.mu.Unlock()
		c.Close()
		return
	}
	srv.sessions[s] = struct{}{}
	srv.wg.Add(1)
	srv.mu.Unlock()
	go srv.handle(s)
}

// handle is a connection's handler goroutine: handshake, then the client
// reader; it returns after every goroutine of the session has exited.
func (srv *Server) handle(s *session) {
	defer srv.wg.Done()
	defer func() {
		srv.mu.Lock()
		delete(srv.sessions, s)
		srv.mu.Unlock()
	}()
	defer func() {
		s.cancel()
		s.clientConn.Close()
		s.mu.Lock()
		up := s.upConn
		s.mu.Unlock()
		if up != nil {
			up.Close()
		}
	}()
	ok := s.handshake(srv.ctx)
	close(s.handshook)
	if !ok {
		return
	}
	if srv.beforeRelay != nil {
		srv.beforeRelay(s)
	}
	s.run()
	reason := "unknown"
	if err := s.endReason(); err != nil {
		reason = err.Error()
	}
	s.log.Info("client connection closed", "reason", reason,
		"duration", time.Since(s.opened).Round(time.Millisecond).String())
}

// Shutdown stops accepting and closes every client connection as RabbitMQ
// does when it stops, connection.close 320 CONNECTION_FORCED, but only
// once the client has been sent every confirm it is owed: each connection
// stops taking methods from its client, waits until the publishes its
// hooks took are answered and RabbitMQ's confirms are relayed, then sends
// the close. It waits for the connections to end. The confirms are waited
// for until ctx's deadline less the close timeout (at most half of the
// time left), so the close still goes out; when ctx ends first Shutdown
// closes the rest at once (see Close) and returns ctx's error.
func (srv *Server) Shutdown(ctx context.Context) error {
	sessions := srv.stopAccepting()
	dctx, cancel := drainContext(ctx, srv.cfg.CloseTimeout)
	defer cancel()
	var drains sync.WaitGroup
	for _, s := range sessions {
		drains.Go(func() { s.shutdown(dctx) })
	}
	done := make(chan struct{})
	go func() { drains.Wait(); srv.wg.Wait(); close(done) }()
	select {
	case <-done:
		srv.cancel()
		return nil
	case <-ctx.Done():
		srv.Close()
		<-done
		return ctx.Err()
	}
}

// drainContext is ctx ending closeTimeout (at most half the time left)
// before ctx's deadline.
func drainContext(ctx context.Context, closeTimeout time.Duration) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	left := time.Until(d)
	return context.WithDeadline(ctx, d.Add(-min(closeTimeout, left/2)))
}

// Close stops accepting, closes every connection at once and waits for all
// of the Server's goroutines to exit.
func (srv *Server) Close() error {
	srv.cancel()
	for _, s := range srv.stopAccepting() {
		s.abort()
	}
	srv.wg.Wait()
	return nil
}

// stopAccepting closes the listeners and returns the live sessions.
func (srv *Server) stopAccepting() []*session {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.closed = true
	for l := range srv.listeners {
		l.Close()
	}
	out := make([]*session, 0, len(srv.sessions))
	for s := range srv.sessions {
		out = append(out, s)
	}
	return out
}

// setNoDelay turns Nagle off on TCP connections (Go's default, made explicit
// because the relay depends on it).
func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
}
