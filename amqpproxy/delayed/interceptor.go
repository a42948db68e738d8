package delayed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
)

// Scheduler is told about every message stored, so that one due inside the
// loaded horizon enters the in-memory wheel; *scheduler.Scheduler has it.
type Scheduler interface {
	Added(msgs ...*store.Message)
	Cancelled(keys ...store.Key)
}

// Config configures an Interceptor.
type Config struct {
	Store     store.Store
	Scheduler Scheduler
	// MaxDelay refuses larger x-delay values with 406; 0 means no limit.
	MaxDelay time.Duration
	// Now is the wall clock due times are computed from; default time.Now.
	Now func() time.Time
	// QueueLen bounds each connection's publishes waiting to be stored;
	// reading from the client stops while it is full. Default 1024.
	QueueLen int
	Metrics  *metrics.Metrics // optional
	Logger   *slog.Logger     // default slog.Default()
}

// Interceptor is the delayed-exchange layer: an amqpproxy.Interceptor.
type Interceptor struct {
	cfg Config

	ctx    context.Context // ended by Close: stops waiting for the store
	cancel context.CancelFunc
	wg     sync.WaitGroup // every storer and registry goroutine
}

// New returns an Interceptor over an open store.
func New(cfg Config) *Interceptor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Interceptor{cfg: cfg, ctx: ctx, cancel: cancel}
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
	h := &conn{
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

// job is one delayed publish waiting to be stored.
type job struct {
	msg *store.Message
	pub *amqpproxy.Publish
}

// conn is one client connection's hooks.
type conn struct {
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
func (h *conn) Methods() []wire.MethodID { return hookedMethods }

// Method implements amqpproxy.ConnHooks.
func (h *conn) Method(call *amqpproxy.Call) {
	switch m := call.Method.(type) {
	case *wire.ExchangeDeclare:
		if m.Type == TypeDelayed && !m.Passive {
			h.declare(call, m)
			return
		}
	case *wire.ExchangeDelete:
		if _, ok := h.i.cfg.Store.Exchange(h.c.VHost, m.Exchange); ok {
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

// declare declares the real exchange upstream, then records it.
func (h *conn) declare(call *amqpproxy.Call, m *wire.ExchangeDeclare) {
	up, err := RealDeclare(m)
	if err != nil {
		closeCall(call, err)
		return
	}
	done := make(chan struct{})
	h.mu.Lock()
	prev := h.declaring[m.Exchange]
	h.declaring[m.Exchange] = done
	h.mu.Unlock()
	finish := func() {
		h.mu.Lock()
		if h.declaring[m.Exchange] == done {
			delete(h.declaring, m.Exchange)
		}
		h.mu.Unlock()
		close(done)
	}
	def := Def(h.c.VHost, &up)
	what := "record delayed exchange " + m.Exchange
	noWait := m.NoWait
	call.Relay(&up, func(r *amqpproxy.Reply) {
		if r.Err != nil || r.Method.ID() != wire.IDExchangeDeclareOk {
			finish()
			if r.Err == nil {
				r.Pass()
			}
			return
		}
		h.recordThenAnswer(r, noWait, what, func() error {
			defer finish()
			if prev != nil {
				<-prev
			}
			return h.i.cfg.Store.PutExchange(h.i.ctx, def)
		})
	})
}

// recordThenAnswer runs a registry write after RabbitMQ's OK, off the
// upstream reader (it fsyncs), then answers the client: RabbitMQ's reply,
// nothing for a request it sent with no-wait, or 541 when the write failed.
func (h *conn) recordThenAnswer(r *amqpproxy.Reply, noWait bool, what string, write func() error) {
	h.i.wg.Go(func() {
		if err := write(); err != nil {
			h.i.cfg.Logger.Error("cannot "+what, "vhost", h.c.VHost, "err", err)
			r.CloseChannel(wire.InternalError, "cannot "+what+": "+err.Error())
			return
		}
		if noWait {
			r.Drop()
		} else {
			r.Pass()
		}
	})
}

// delete deletes the real exchange upstream, then drops the delayed
// exchange and its pending messages.
func (h *conn) delete(call *amqpproxy.Call, m *wire.ExchangeDelete) {
	req := *m
	req.NoWait = false
	noWait := m.NoWait
	vhost, name := h.c.VHost, m.Exchange
	call.Relay(&req, func(r *amqpproxy.Reply) {
		if r.Err != nil || r.Method.ID() != wire.IDExchangeDeleteOk {
			if r.Err == nil {
				r.Pass()
			}
			return
		}
		h.recordThenAnswer(r, noWait, "drop delayed exchange "+name, func() error {
			n, err := h.i.cfg.Store.DeleteExchange(h.i.ctx, vhost, name)
			if n > 0 {
				h.i.cfg.Metrics.Discarded(int(n))
				h.i.cfg.Logger.Info("delayed exchange deleted, pending messages discarded", "vhost", vhost, "exchange", name, "discarded", n)
			}
			return err
		})
	})
}

// commit stores a transaction's delayed publishes, then relays tx.commit;
// if RabbitMQ does not commit, the stored messages are cancelled.
func (h *conn) commit(call *amqpproxy.Call, msgs []*store.Message) {
	st := h.i.cfg.Store
	if err := st.Put(h.i.ctx, msgs...); err != nil {
		h.i.cfg.Metrics.Refused(metrics.RefusedStoreError)
		h.i.cfg.Logger.Error("cannot store delayed messages at tx.commit", "vhost", h.c.VHost, "n", len(msgs), "err", err)
		call.CloseChannel(wire.ResourceError, "cannot store delayed messages: "+err.Error())
		return
	}
	call.Relay(nil, func(r *amqpproxy.Reply) {
		if r.Err == nil && r.Method.ID() == wire.IDTxCommitOk {
			h.i.cfg.Metrics.Stored(len(msgs))
			h.i.cfg.Scheduler.Added(msgs...)
			r.Pass()
			return
		}
		if r.Err == nil {
			r.Pass()
		}
		h.i.wg.Add(1)
		go func() {
			defer h.i.wg.Done()
			for _, m := range msgs {
				if _, err := st.CancelKey(context.Background(), m.Key); err != nil {
					h.i.cfg.Logger.Error("cannot withdraw delayed message of a failed tx.commit", "key", fmt.Sprintf("%x", m.Key), "err", err)
				}
			}
		}()
	})
}

// InterceptsPublish implements amqpproxy.ConnHooks: publishes to a delayed
// exchange, or to one this connection is declaring, are taken.
func (h *conn) InterceptsPublish(ch *amqpproxy.Channel, m *wire.BasicPublish) bool {
	if m.Exchange == "" {
		return false
	}
	if _, ok := h.i.cfg.Store.Exchange(h.c.VHost, m.Exchange); ok {
		return true
	}
	h.mu.Lock()
	_, ok := h.declaring[m.Exchange]
	h.mu.Unlock()
	return ok
}

// Publish implements amqpproxy.ConnHooks.
func (h *conn) Publish(p *amqpproxy.Publish) {
	h.mu.Lock()
	wait := h.declaring[p.Publish.Exchange]
	h.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-h.c.Done():
			return
		}
		if _, ok := h.i.cfg.Store.Exchange(h.c.VHost, p.Publish.Exchange); !ok {
			p.Relay() // the declare failed: RabbitMQ answers as it would
			return
		}
	}
	props, err := wire.DecodeProperties(p.Properties())
	if err != nil {
		h.c.Close(wire.SyntaxError, "content header: "+err.Error())
		return
	}
	ms, held, err := ParseDelay(props.Headers, h.i.cfg.MaxDelay)
	if err != nil {
		reason := metrics.RefusedInvalidDelay
		if errors.Is(err, ErrDelayTooLong) {
			reason = metrics.RefusedDelayTooLong
		}
		h.i.cfg.Metrics.Refused(reason)
		closePublish(p, err)
		return
	}
	if !held || p.Publish.Immediate {
		p.Relay() // routed at once, header as it was; immediate: RabbitMQ's 540
		return
	}
	if props.UserID != "" && props.UserID != h.c.User {
		p.CloseChannel(wire.PreconditionFailed, fmt.Sprintf(
			"user_id property set to '%s' but authenticated user was '%s'", props.UserID, h.c.User))
		return
	}
	// The proxy releases with its own account: RabbitMQ judges the
	// client's right to publish here, before anything is stored.
	if err := h.checkPublish(p.Publish.Exchange, p.Publish.RoutingKey); err != nil {
		reason := metrics.RefusedUpstream
		if code, _ := replyOf(err); code == wire.AccessRefused {
			reason = metrics.RefusedForbidden
		}
		h.i.cfg.Metrics.Refused(reason)
		closePublish(p, err)
		return
	}
	def, _ := h.i.cfg.Store.Exchange(h.c.VHost, p.Publish.Exchange) // gone: incarnation 0, which Put refuses
	msg := &store.Message{
		VHost:       h.c.VHost,
		Exchange:    p.Publish.Exchange,
		RoutingKey:  p.Publish.RoutingKey,
		Mandatory:   p.Publish.Mandatory,
		Properties:  p.Properties(),
		Body:        p.Body,
		Due:         DueAt(h.i.cfg.Now(), ms),
		Delay:       ms,
		Priority:    props.Priority,
		MessageID:   props.MessageID,
		Incarnation: def.Incarnation,
	}
	if p.Channel.TxMode() {
		h.tx[p.Channel] = append(h.tx[p.Channel], msg)
		p.Ack() // done; tx.commit stores it
		return
	}
	select {
	case h.queue <- &job{msg: msg, pub: p}:
	case <-h.c.Done():
	}
}

// checkPublish asks RabbitMQ (Conn.CheckPublish) whether the client's user
// may publish to the delayed exchange: write permission, and topic
// permission on the routing key when the exchange routes by topic.
func (h *conn) checkPublish(exchange, routingKey string) error {
	if d, ok := h.i.cfg.Store.Exchange(h.c.VHost, exchange); !ok || d.DelayedType != "topic" {
		routingKey = "" // only topic exchanges check the key
	}
	return h.c.CheckPublish(h.i.ctx, exchange, routingKey)
}

// storer stores the connection's delayed publishes in the order they came,
// batching whatever queued up during the previous commit, and answers them.
func (h *conn) storer() {
	defer h.i.wg.Done()
	batch := make([]*job, 0, 64)
	msgs := make([]*store.Message, 0, 64)
	for j := range h.queue {
		batch = append(batch[:0], j)
	more:
		for len(batch) < cap(batch) {
			select {
			case j, ok := <-h.queue:
				if !ok {
					break more
				}
				batch = append(batch, j)
			default:
				break more
			}
		}
		msgs = msgs[:0]
		for _, j := range batch {
			msgs = append(msgs, j.msg)
		}
		err := h.i.cfg.Store.Put(h.i.ctx, msgs...)
		if err != nil {
			h.i.cfg.Logger.Error("cannot store delayed messages", "vhost", h.c.VHost, "n", len(msgs), "err", err)
			for _, j := range batch {
				h.i.cfg.Metrics.Refused(metrics.RefusedStoreError)
				if j.pub.Channel.ConfirmMode() {
					j.pub.Nack()
				} else {
					j.pub.CloseChannel(wire.ResourceError, "cannot store delayed message: "+err.Error())
				}
			}
			continue
		}
		h.i.cfg.Scheduler.Added(msgs...)
		h.i.cfg.Metrics.Stored(len(msgs))
		for _, j := range batch {
			j.pub.Ack()
		}
		clear(batch)
	}
}

// Closed implements amqpproxy.ConnHooks: publishes already read are still
// stored, then the storer ends.
func (h *conn) Closed(error) { close(h.queue) }

// closeCall closes the call's channel with the error's code and text.
func closeCall(call *amqpproxy.Call, err error) {
	code, text := replyOf(err)
	call.CloseChannel(code, text)
}

// closePublish closes the publish's channel with the error's code and text.
func closePublish(p *amqpproxy.Publish, err error) {
	code, text := replyOf(err)
	p.CloseChannel(code, text)
}

func replyOf(err error) (uint16, string) {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code, we.Text
	}
	return wire.InternalError, err.Error()
}
