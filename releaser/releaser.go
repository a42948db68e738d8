package releaser

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// Sentinel errors of the releaser.
var (
	// ErrClosed: Release or Ping was called after Close.
	ErrClosed = errors.New("releaser: closed")
)

// Config configures a Releaser.
type Config struct {
	// URL is the proxy's own RabbitMQ account, amqp:// or amqps://. Its
	// vhost is ignored: the releaser opens one connection per vhost.
	URL string
	// TLS is used for amqps:// URLs; nil means the system defaults.
	TLS *tls.Config
	// ConfirmTimeout bounds the wait for a batch's confirms; unconfirmed
	// messages are retried later. Default 30 s.
	ConfirmTimeout time.Duration
	// DialTimeout bounds connecting to RabbitMQ. Default 10 s.
	DialTimeout time.Duration
	// Heartbeat of the release connections. Default 10 s.
	Heartbeat time.Duration
	// Lookup returns the registry's definition of a delayed exchange; used to
	// declare the real exchange again when RabbitMQ no longer has it.
	Lookup func(vhost, name string) (store.ExchangeDef, bool)
	// OnUnroutable is called for each release RabbitMQ returned (no queue
	// took it). Optional.
	OnUnroutable func(vhost, exchange, routingKey string)
	// OnReconnect is called each time a vhost's connection is dialled after
	// a failure. Optional.
	OnReconnect func(vhost string)
	// Name prefixes the connection_name of the release connections
	// ("<Name> <vhost>"), as RabbitMQ lists them. Default "delayproxy releaser".
	Name string
	// Logger receives one line per unroutable release and per lost
	// connection. Default slog.Default().
	Logger *slog.Logger
}

// Releaser publishes due messages upstream; see the package doc.
type Releaser struct {
	cfg  Config
	base amqp.URI

	mu      sync.Mutex // guards conns, dialled, failed, dials and closed
	conns   map[string]*vhostConn
	dialled map[string]bool // vhosts connected at least once: a new dial is a reconnect
	// failed is when a vhost's publish last failed before anything was
	// confirmed (no connection, a publish error). Batches handed over just
	// after it are refused rather than published, so that they cannot
	// overtake the failed one, which the scheduler retries first.
	failed map[string]time.Time
	dials  int // dial attempts, for tests
	closed bool
	wg     sync.WaitGroup // return and close watchers of every vhostConn
}

// New checks the URL and returns a Releaser; it dials nothing until the first
// release.
func New(cfg Config) (*Releaser, error) {
	uri, err := amqp.ParseURI(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("releaser: release URL: %w", err)
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 30 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Name == "" {
		cfg.Name = "delayproxy releaser"
	}
	return &Releaser{cfg: cfg, base: uri, conns: map[string]*vhostConn{}, dialled: map[string]bool{}, failed: map[string]time.Time{}}, nil
}

// vhostConn is the release connection and channel of one vhost.
type vhostConn struct {
	vhost string
	conn  *amqp.Connection
	ch    *amqp.Channel
	cork  *corkConn // conn's socket, corked around each batch
	// pub serialises publishing so each batch goes out in order, unbroken.
	pub sync.Mutex
	// dead is closed when the channel or connection has closed.
	dead chan struct{}
	// closeErr is the reason; written once before dead is closed.
	closeErr *amqp.Error
}

// Release publishes batch in order and reports which messages RabbitMQ
// confirmed. It implements scheduler.Releaser.
func (r *Releaser) Release(ctx context.Context, batch []*store.Message) []bool {
	return r.Publish(ctx, batch)()
}

// Publish publishes batch in order and returns a function that waits for
// RabbitMQ's confirms and reports which messages it confirmed. It implements
// scheduler.PipelinedReleaser: batches published one after another go out
// in that order, while their confirms are awaited concurrently.
func (r *Releaser) Publish(ctx context.Context, batch []*store.Message) (wait func() []bool) {
	confirmed := make([]bool, len(batch))
	// Group by vhost, keeping order within each; usually there is one.
	var order []string
	groups := map[string][]int{}
	for i, m := range batch {
		if _, ok := groups[m.VHost]; !ok {
			order = append(order, m.VHost)
		}
		groups[m.VHost] = append(groups[m.VHost], i)
	}
	waits := make([]func(), 0, len(order))
	for _, vhost := range order {
		waits = append(waits, r.publishVHost(ctx, vhost, batch, groups[vhost], confirmed))
	}
	return func() []bool {
		for _, w := range waits {
			w()
		}
		return confirmed
	}
}

// publishVHost publishes the messages batch[idx] of one vhost and returns a
// function that waits for their confirms and records them in confirmed.
func (r *Releaser) publishVHost(ctx context.Context, vhost string, batch []*store.Message, idx []int, confirmed []bool) (wait func()) {
	r.mu.Lock()
	failedAt := r.failed[vhost]
	r.mu.Unlock()
	if time.Since(failedAt) < failFast {
		return func() {} // an earlier batch failed just now: it goes first
	}
	vc, err := r.conn(ctx, vhost)
	if err != nil {
		r.cfg.Logger.Warn("release connection failed", "vhost", vhost, "err", err)
		r.markFailed(vhost)
		return func() {}
	}
	dcs := make([]*amqp.DeferredConfirmation, len(idx))
	vc.pub.Lock()
	vc.cork.cork()
	for n, i := range idx {
		m := batch[i]
		pub, err := publishing(m)
		if err != nil {
			// The proxy decoded these properties when it stored the
			// message, so this is a corrupt record: it can never be
			// released. Say so loudly and let it go.
			r.cfg.Logger.Error("discarding stored message with undecodable properties",
				"vhost", vhost, "exchange", m.Exchange, "key", fmt.Sprintf("%x", m.Key), "err", err)
			confirmed[i] = true
			continue
		}
		dc, err := vc.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, true, false, pub)
		if err != nil {
			r.markFailed(vhost)
			break // the channel is gone; the rest stay unconfirmed
		}
		dcs[n] = dc
	}
	vc.cork.uncork()
	vc.pub.Unlock()

	return func() {
		// Confirms of what was published are awaited even when ctx ends: a
		// message RabbitMQ took must leave the store, or a restart would
		// release it again.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ConfirmTimeout)
		defer cancel()
		allOK := true
		for n, dc := range dcs {
			if dc == nil {
				continue
			}
			ok, err := dc.WaitContext(wctx)
			confirmed[idx[n]] = ok && err == nil
			allOK = allOK && confirmed[idx[n]]
		}
		if !allOK && vc.ch.IsClosed() {
			// amqp091-go fails the pending confirms before the close
			// watcher records why the channel closed: wait for it, so a
			// 404 is seen and the exchange declared again.
			select {
			case <-vc.dead:
			case <-time.After(time.Second):
			}
		}
		select {
		case <-vc.dead:
			r.drop(vc)
			if vc.closeErr != nil && vc.closeErr.Code == amqp.NotFound {
				r.redeclare(ctx, vhost, batch, idx)
			}
		default:
		}
	}
}

// failFast is how long after a failed publish later batches of the vhost
// are refused unpublished. It is shorter than the scheduler's shortest retry
// hold (100 ms), so the retried batch itself is published.
const failFast = 50 * time.Millisecond

func (r *Releaser) markFailed(vhost string) {
	r.mu.Lock()
	r.failed[vhost] = time.Now()
	r.mu.Unlock()
}

// conn returns the live connection of vhost, dialling it if needed.
func (r *Releaser) conn(ctx context.Context, vhost string) (*vhostConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if vc := r.conns[vhost]; vc != nil {
		select {
		case <-vc.dead:
		default:
			return vc, nil
		}
		r.closeLocked(vc)
	}
	vc, err := r.dial(ctx, vhost)
	if err != nil {
		return nil, err
	}
	r.conns[vhost] = vc
	if r.dialled[vhost] && r.cfg.OnReconnect != nil {
		r.cfg.OnReconnect(vhost)
	}
	r.dialled[vhost] = true
	return vc, nil
}

func (r *Releaser) dial(ctx context.Context, vhost string) (*vhostConn, error) {
	r.dials++ // r.mu is held
	uri := r.base
	uri.Vhost = vhost
	cfg := amqp.Config{
		Heartbeat:       r.cfg.Heartbeat,
		TLSClientConfig: r.cfg.TLS,
		Locale:          "en_US",
		Properties:      amqp.Table{"connection_name": r.cfg.Name + " " + vhost, "product": "delayproxy"},
	}
	var cork *corkConn
	dial := amqp.DefaultDial(r.cfg.DialTimeout)
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		conn, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		cork = &corkConn{Conn: conn}
		return cork, nil
	}
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := amqp.DialConfig(uri.String(), cfg)
		done <- result{c, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		go func() { // let the dial finish and close it
			if res := <-done; res.conn != nil {
				res.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
	if res.err != nil {
		return nil, fmt.Errorf("dial vhost %q: %w", vhost, res.err)
	}
	ch, err := res.conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		res.conn.Close()
		return nil, fmt.Errorf("open release channel on vhost %q: %w", vhost, err)
	}
	vc := &vhostConn{vhost: vhost, conn: res.conn, ch: ch, cork: cork, dead: make(chan struct{})}
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	connClosed := res.conn.NotifyClose(make(chan *amqp.Error, 1))
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		for ret := range returns {
			r.cfg.Logger.Warn("delayed message unroutable at release",
				"vhost", vhost, "exchange", ret.Exchange, "routing_key", ret.RoutingKey,
				"reply", fmt.Sprintf("%d %s", ret.ReplyCode, ret.ReplyText))
			if r.cfg.OnUnroutable != nil {
				r.cfg.OnUnroutable(vhost, ret.Exchange, ret.RoutingKey)
			}
		}
	}()
	go func() {
		defer r.wg.Done()
		var e *amqp.Error
		select {
		case e = <-chClosed:
		case e = <-connClosed:
		}
		vc.closeErr = e
		close(vc.dead)
		if e != nil {
			r.cfg.Logger.Warn("release connection lost", "vhost", vhost, "err", e)
		}
	}()
	return vc, nil
}

// drop forgets vc if it is still the vhost's connection, and closes it.
func (r *Releaser) drop(vc *vhostConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns[vc.vhost] == vc {
		delete(r.conns, vc.vhost)
	}
	r.closeLocked(vc)
}

func (r *Releaser) closeLocked(vc *vhostConn) {
	vc.conn.Close() // the close watcher then closes vc.dead
}

// redeclare declares again, from the registry, the real exchanges of the
// messages in idx.
func (r *Releaser) redeclare(ctx context.Context, vhost string, batch []*store.Message, idx []int) {
	if r.cfg.Lookup == nil {
		return
	}
	seen := map[string]bool{}
	for _, i := range idx {
		name := batch[i].Exchange
		if seen[name] {
			continue
		}
		seen[name] = true
		def, ok := r.cfg.Lookup(vhost, name)
		if !ok {
			continue
		}
		if err := r.declare(ctx, def); err != nil {
			r.cfg.Logger.Warn("cannot declare missing exchange again", "vhost", vhost, "exchange", name, "err", err)
			continue
		}
		r.cfg.Logger.Info("declared missing exchange again from the registry", "vhost", vhost, "exchange", name, "type", def.DelayedType)
	}
}

// declare declares the real exchange of a delayed exchange upstream.
func (r *Releaser) declare(ctx context.Context, def store.ExchangeDef) error {
	vc, err := r.conn(ctx, def.VHost)
	if err != nil {
		return err
	}
	// The real exchange carries the declared arguments, x-delayed-type
	// included, exactly as the proxy declared it for the client.
	args, err := tableOf(wire.Table(def.Arguments))
	if err != nil {
		return err
	}
	ch, err := vc.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return ch.ExchangeDeclare(def.Name, def.DelayedType, def.Durable, def.AutoDelete, def.Internal, false, args)
}

// Warm dials the connections of vhosts in the background, so that the
// first release after start-up does not wait for a dial. Failures are left
// for the first release to retry.
func (r *Releaser) Warm(ctx context.Context, vhosts ...string) {
	for _, v := range vhosts {
		r.wg.Go(func() {
			if _, err := r.conn(ctx, v); err != nil {
				r.cfg.Logger.Warn("release connection failed", "vhost", v, "err", err)
			}
		})
	}
}

// Ping dials (or reuses) the connection of vhost: the readiness check.
func (r *Releaser) Ping(ctx context.Context, vhost string) error {
	_, err := r.conn(ctx, vhost)
	return err
}

// Close closes every connection and waits for their watchers.
func (r *Releaser) Close() error {
	r.mu.Lock()
	r.closed = true
	for v, vc := range r.conns {
		r.closeLocked(vc)
		delete(r.conns, v)
	}
	r.mu.Unlock()
	r.wg.Wait()
	return nil
}
