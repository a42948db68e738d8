package delayed

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
)

// Store is what the layer needs of the store (see package store for the
// contract); *store.Store has it.
type Store interface {
	// Exchange looks a delayed exchange up in the registry. The def is
	// shared: read it, never change it.
	Exchange(vhost, name string) (store.ExchangeDef, bool)
	// PutExchange records a delayed exchange durably and sets
	// def.Incarnation.
	PutExchange(ctx context.Context, def *store.ExchangeDef) error
	// PutAsync queues msgs to be stored durably and returns; wait returns
	// nil only once they are fsync'd. Calls made one after another take
	// sequences in that order (publish order). Each message carries the
	// Incarnation of the registry record it was published under; a
	// message whose exchange is gone or re-created since fails the whole
	// Put with store.ErrUnknownExchange.
	PutAsync(ctx context.Context, msgs ...*store.Message) (wait func() error)
	// CancelKey removes one stored message.
	CancelKey(ctx context.Context, key store.Key) (bool, error)
}

// Scheduler is told about every message stored, so that one due inside the
// loaded horizon enters the in-memory wheel, and removes deleted exchanges
// from the store; *scheduler.Scheduler has it.
type Scheduler interface {
	Added(msgs ...*store.Message)
	// DeleteExchange removes from the store a delayed exchange whose real
	// exchange RabbitMQ has deleted, durably, and counts and logs its
	// discarded messages: those still pending, never one released.
	DeleteExchange(ctx context.Context, vhost, name string) error
}

// Metrics receives the layer's counts; *metrics.Metrics has them.
type Metrics interface {
	// Stored: n delayed publishes were stored and confirmed.
	Stored(n int)
	// Refused: a delayed publish was refused, for reason.
	Refused(reason metrics.RefuseReason)
}

// Intake lets a storer's publishes into Puts; *intake.Gate has it.
type Intake interface {
	// Acquire waits for room for up to want messages (at least one) and
	// returns how many it granted, or ctx's error.
	Acquire(ctx context.Context, want int) (int, error)
	// Release gives back room that Acquire granted.
	Release(n int)
}

// openIntake is an Intake that never waits.
type openIntake struct{}

func (openIntake) Acquire(_ context.Context, want int) (int, error) { return max(want, 1), nil }

func (openIntake) Release(int) {}

type noMetrics struct{}

func (noMetrics) Stored(int) {}

func (noMetrics) Refused(metrics.RefuseReason) {}

// Config configures an Interceptor.
type Config struct {
	Store     Store
	Scheduler Scheduler
	// MaxDelay refuses larger x-delay values, and delivery times further
	// ahead, with 406; 0 means no limit.
	MaxDelay time.Duration
	// ReleaseWindow rounds due times up to a multiple of it, in whole
	// milliseconds since the unix epoch (windowDue); 0 or 1 ms keeps them
	// exact.
	ReleaseWindow time.Duration
	// DeliveryTimeHeaders takes publishes to any other exchange that ask
	// for a delay with x-opt-delivery-time or x-opt-delivery-delay (see
	// InterceptsContent); false relays them untouched.
	DeliveryTimeHeaders bool
	// Now is the wall clock due times are computed from; default time.Now.
	Now func() time.Time
	// Intake is the window of delayed publishes that may be in Puts at
	// once across all connections (releases first: package intake);
	// default: always open.
	Intake Intake
	// QueueLen bounds each connection's publishes waiting to be stored;
	// reading from the client stops while it is full. Default 1024.
	QueueLen int
	Metrics  Metrics      // default: none
	Logger   *slog.Logger // default slog.Default()
}

// Interceptor is the delayed-exchange layer: an amqpproxy.Interceptor.
type Interceptor struct {
	cfg Config

	ctx    context.Context // ended by Close: stops waiting for the store
	cancel context.CancelFunc
	wg     sync.WaitGroup // every storer and registry goroutine

	mu sync.Mutex // guards deleting
	// deleting counts, per delayed exchange, the exchange.deletes under
	// way: from the relay until the store has removed it (Lookup).
	deleting map[exchangeID]int
}

// New returns an Interceptor over an open store.
func New(cfg Config) *Interceptor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Intake == nil {
		cfg.Intake = openIntake{}
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Interceptor{cfg: cfg, ctx: ctx, cancel: cancel, deleting: map[exchangeID]int{}}
}

// Wait blocks until every publish the interceptor took has been stored (and
// answered) or failed, and every registry update finished. Call it after the
// proxy's connections have closed and before the store is closed.
func (i *Interceptor) Wait() { i.wg.Wait() }

// Close abandons waits on the store (they fail, and are nacked) and waits.
func (i *Interceptor) Close() {
	i.cancel()
	i.wg.Wait()
}

// Open implements amqpproxy.Interceptor.
func (i *Interceptor) Open(c *amqpproxy.Conn) amqpproxy.ConnHooks {
	h := &connHooks{
		i:         i,
		c:         c,
		queue:     make(chan *job, i.cfg.QueueLen),
		declaring: map[string]chan struct{}{},
		tx:        map[*amqpproxy.Channel][]*store.Message{},
	}
	i.wg.Add(1)
	go h.storer()
	return h
}

// connHooks are one client connection's hooks (amqpproxy.ConnHooks).
type connHooks struct {
	i     *Interceptor
	c     *amqpproxy.Conn
	queue chan *job // publishes to store, in the order the client sent them

	mu sync.Mutex // guards declaring
	// declaring holds the delayed exchanges this connection is declaring:
	// a publish to one waits until RabbitMQ answered and the registry has it.
	declaring map[string]chan struct{}

	// tx holds each transactional channel's delayed publishes until
	// tx.commit; client reader goroutine only.
	tx map[*amqpproxy.Channel][]*store.Message
}

var hookedMethods = []wire.MethodID{wire.IDExchangeDeclare, wire.IDExchangeDelete, wire.IDTxCommit, wire.IDTxRollback}

// Methods implements amqpproxy.ConnHooks.
func (h *connHooks) Methods() []wire.MethodID { return hookedMethods }

// Method implements amqpproxy.ConnHooks.
func (h *connHooks) Method(call *amqpproxy.Call) {
	switch m := call.Method.(type) {
	case *wire.ExchangeDeclare:
		if m.Type == TypeDelayed && !m.Passive {
			h.declare(call, m)
			return
		}
	case *wire.ExchangeDelete:
		// The delete of an exchange with delivery-time messages is only
		// relayed: they stay, and meet the exchange at their release, gone
		// or declared again by then (see releaser).
		if d, ok := h.i.cfg.Store.Exchange(h.c.VHost, m.Exchange); ok && d.Kind == store.KindDelayed {
			h.delete(call, m)
			return
		}
	case *wire.TxCommit:
		if msgs := h.tx[call.Channel]; len(msgs) > 0 {
			delete(h.tx, call.Channel)
			h.commit(call, msgs)
			return
		}
	case *wire.TxRollback:
		delete(h.tx, call.Channel)
	}
	call.Relay(nil, nil)
}

// Closed implements amqpproxy.ConnHooks: publishes already read are still
// stored, then the storer ends.
func (h *connHooks) Closed(error) { close(h.queue) }

func replyOf(err error) (uint16, string) {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code, we.Text
	}
	return wire.InternalError, err.Error()
}
