package releaser

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/amqpurl"
	"github.com/delayproxy/delayproxy/store"
)

// Sentinel errors of the releaser.
var (
	// ErrClosed: Ping was called after Close (Release and Publish report
	// every message unconfirmed then).
	ErrClosed = errors.New("releaser: closed")
)

// Registry is where the releaser finds the definition of a delayed
// exchange, to declare its real exchange again when RabbitMQ no longer has
// it. The store satisfies it.
type Registry interface {
	Exchange(vhost, name string) (store.ExchangeDef, bool)
}

// Metrics counts what the releaser sees. *metrics.Metrics satisfies it.
type Metrics interface {
	// Unroutable counts releases RabbitMQ returned: no queue took them.
	Unroutable(n int)
	// UpstreamReconnect counts a vhost's connection dialled again after
	// it was lost.
	UpstreamReconnect()
}

// DelayType is the field type of the released x-delay header.
type DelayType string

const (
	// DelayInt64 is a signed 64-bit 'l', as RabbitMQ 3.13 and later write
	// it (the plugin's annotation, written by mc_amqpl). The default.
	DelayInt64 DelayType = "int64"
	// DelayInt32 is a signed 32-bit 'I', as the plugin wrote it up to
	// RabbitMQ 3.12; a delay that does not fit is written as 'l'.
	DelayInt32 DelayType = "int32"
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
	// DialTimeout bounds connecting to RabbitMQ, handshake included, and
	// declaring an exchange again. Default 10 s.
	DialTimeout time.Duration
	// Heartbeat the release connections ask for; RabbitMQ's offer wins
	// when it is shorter. Default 10 s.
	Heartbeat time.Duration
	// DelayType is the type of the released x-delay. Default DelayInt64.
	DelayType DelayType
	// Registry has the delayed exchanges, to declare a real exchange again
	// when RabbitMQ lost it. nil: none is declared again.
	Registry Registry
	// Metrics receives the counts; nil: none.
	Metrics Metrics
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
	acct amqpurl.Endpoint

	mu      sync.Mutex // guards conns, dialing, dialled, failed, missing, dials and closed
	conns   map[string]*conn
	dialing map[string]*dialing // dials in progress, by vhost
	dialled map[string]bool     // vhosts connected at least once: a new dial is a reconnect
	// failed is when a vhost's publish last failed before anything was
	// confirmed (no connection, a connection lost with releases in
	// flight). Batches handed over just after it are refused rather than
	// published, so that they cannot overtake the failed one, which the
	// scheduler retries first.
	failed map[string]time.Time
	// missing holds the delivery-time exchanges a release found missing,
	// with how many checks in a row found them missing since (missing.go).
	missing map[exchangeID]int
	dials   int // dial attempts, for tests
	closed  bool

	// stop ends when Close is called: it ends every dial in progress and
	// redial's waits.
	stop     context.Context
	stopping context.CancelFunc

	wg sync.WaitGroup // every goroutine it starts: Warm's dials, redials, each connection's reader and heartbeat
}

// New checks cfg and returns a Releaser; it dials nothing until the first
// release.
func New(cfg Config) (*Releaser, error) {
	acct, err := amqpurl.Parse(cfg.URL, cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("releaser: release URL: %w", err)
	}
	switch cfg.DelayType {
	case "":
		cfg.DelayType = DelayInt64
	case DelayInt64, DelayInt32:
	default:
		return nil, fmt.Errorf("releaser: x-delay type %q: want %q or %q", cfg.DelayType, DelayInt64, DelayInt32)
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
	stop, stopping := context.WithCancel(context.Background())
	return &Releaser{cfg: cfg, acct: acct, conns: map[string]*conn{}, dialing: map[string]*dialing{}, dialled: map[string]bool{},
		failed: map[string]time.Time{}, missing: map[exchangeID]int{}, stop: stop, stopping: stopping}, nil
}

// Release publishes batch in order and reports which messages RabbitMQ
// confirmed. It implements scheduler.Releaser.
func (r *Releaser) Release(ctx context.Context, batch []*store.Message) []bool {
	wait, _ := r.Publish(ctx, batch)
	return wait()
}

// Publish publishes batch in order and returns a function that waits for
// RabbitMQ's confirms and reports which messages it confirmed; refused
// when some were not written because a vhost's connection failed, now or
// just before. It implements scheduler.PipelinedReleaser: batches
// published one after another go out in that order, while their confirms
// are awaited concurrently.
func (r *Releaser) Publish(ctx context.Context, batch []*store.Message) (wait func() []bool, refused bool) {
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
		w, no := r.publishVHost(ctx, vhost, batch, groups[vhost], confirmed)
		waits, refused = append(waits, w), refused || no
	}
	return func() []bool {
		for _, w := range waits {
			w()
		}
		return confirmed
	}, refused
}

// publishVHost publishes the messages batch[idx] of one vhost and returns a
// function that waits for their confirms and records them in confirmed;
// refused when the connection failed or had failed just now, so that they
// were not all written.
func (r *Releaser) publishVHost(ctx context.Context, vhost string, batch []*store.Message, idx []int, confirmed []bool) (wait func(), refused bool) {
	r.mu.Lock()
	failedAt := r.failed[vhost]
	r.mu.Unlock()
	if time.Since(failedAt) < failFast {
		return func() {}, true // an earlier batch failed just now: it goes first
	}
	c, err := r.conn(ctx, vhost)
	if err != nil {
		r.cfg.Logger.Warn("release connection failed", "vhost", vhost, "err", err)
		r.markFailed(vhost)
		return func() {}, true
	}
	if idx = r.dropMissing(ctx, c, vhost, batch, idx, confirmed); len(idx) == 0 {
		return func() {}, false
	}
	p, err := c.publish(batch, idx, confirmed)
	if err != nil {
		r.markFailed(vhost)
	}
	return func() {
		ended := p == nil && err != nil // refused: the connection is ending
		if p != nil {
			// Confirms of what was written are awaited even when ctx
			// ends: a message RabbitMQ took must leave the store, or a
			// restart would release it again.
			ended = c.confirms.await(p, r.cfg.ConfirmTimeout, confirmed)
		}
		if ended {
			// fail ends the confirms, then closes dead: wait for it, or
			// the 404 below goes unseen and the vhost's next batch meets
			// a connection that is still closing.
			<-c.dead
		}
		select {
		case <-c.dead:
			r.drop(c)
			if e, ok := c.err.(*wire.Error); ok && e.Code == wire.NotFound {
				r.redeclare(ctx, vhost, batch, r.noteMissing(vhost, batch, idx, confirmed))
			}
		default:
		}
	}, err != nil
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

// conn returns the live connection of vhost, dialling it if needed. When
// the connection ended with releases in flight and their wait has not
// dropped it yet, the batch asking is refused as after a failed publish:
// it must not overtake those releases, which the scheduler retries.
//
// The dial runs outside the lock, so that a slow dial of one vhost holds
// up no other vhost's releases; whoever asks for the same vhost meanwhile
// waits for that dial's result. A dial ends when Close is called.
func (r *Releaser) conn(ctx context.Context, vhost string) (*conn, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	if c := r.conns[vhost]; c != nil {
		select {
		case <-c.dead:
		default:
			r.mu.Unlock()
			return c, nil
		}
		delete(r.conns, vhost)
		if c.lost {
			r.failed[vhost] = time.Now()
			r.mu.Unlock()
			return nil, fmt.Errorf("release connection lost with releases in flight: %w", c.err)
		}
	}
	if d := r.dialing[vhost]; d != nil {
		r.mu.Unlock()
		select {
		case <-d.done:
			return d.c, d.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	d := &dialing{done: make(chan struct{})}
	r.dialing[vhost] = d
	r.dials++
	r.mu.Unlock()
	return r.dialFor(ctx, vhost, d)
}

// dialFor makes d, the dial of vhost that conn started, without the lock,
// and records its connection, or its failure for those waiting on d.
func (r *Releaser) dialFor(ctx context.Context, vhost string, d *dialing) (*conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	stopDial := context.AfterFunc(r.stop, cancel)
	c, rd, err := r.dial(ctx, vhost)
	stopDial()
	cancel()

	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.dialing, vhost)
	switch {
	case r.closed:
		if err == nil {
			c.sock.Close() // nothing of it runs yet
		}
		c, err = nil, ErrClosed
	case err != nil:
		c, err = nil, fmt.Errorf("dial vhost %q: %w", vhost, err)
	default:
		r.start(c, rd)
		r.conns[vhost] = c
		if r.dialled[vhost] && r.cfg.Metrics != nil {
			r.cfg.Metrics.UpstreamReconnect()
		}
		r.dialled[vhost] = true
	}
	d.c, d.err = c, err
	close(d.done)
	return c, err
}

// dialing is a dial of a vhost's connection in progress.
type dialing struct {
	done chan struct{} // closed once c and err are set
	c    *conn
	err  error
}

// drop forgets c, which has ended, if it is still its vhost's connection.
func (r *Releaser) drop(c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns[c.vhost] == c {
		delete(r.conns, c.vhost)
	}
}

// Warm dials the connections of vhosts in the background, so that the
// first release after start-up does not wait for a dial; a dial that fails
// is retried as a redial is, until it succeeds or Close is called.
func (r *Releaser) Warm(vhosts ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return // Close's wait may have begun: start nothing
	}
	for _, v := range vhosts {
		r.wg.Go(func() { r.redial(v, 0) })
	}
}

// Ping dials (or reuses) the connection of vhost: the readiness check.
func (r *Releaser) Ping(ctx context.Context, vhost string) error {
	_, err := r.conn(ctx, vhost)
	return err
}

// Close closes every connection (connection.close, then close-ok or a
// second at most) and waits for every goroutine the Releaser started.
func (r *Releaser) Close() error {
	r.mu.Lock()
	r.closed = true
	r.stopping()
	conns := make([]*conn, 0, len(r.conns))
	for v, c := range r.conns {
		conns = append(conns, c)
		delete(r.conns, v)
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.close(ErrClosed)
	}
	r.wg.Wait()
	return nil
}
