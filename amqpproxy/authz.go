package amqpproxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// Publish permission probes.
//
// A message the proxy takes over is published later by the proxy's own
// account, so RabbitMQ never judges the client's right to publish it. The
// proxy asks RabbitMQ instead, on the client's own upstream connection, on
// the channel no client channel uses (Conn.ReservedChannel):
//
//	channel.open, tx.select          once, while the channel stays open
//	basic.publish(exchange, key)     empty body, mandatory=false
//	+ content header (size 0)
//	tx.rollback                      nothing is ever routed
//
//	tx.rollback-ok                   allowed (cached)
//	channel.close 403 (or 404 ...)   refused with RabbitMQ's code and text;
//	                                 answered with close-ok, reopened lazily
//
// RabbitMQ checks write permission on the exchange at basic.publish, then
// topic permission on the routing key for topic exchanges, and closes the
// channel at the first failure. Frames on the reserved channel never reach
// the client.

// permCacheSize bounds a connection's cache of allowed (exchange, key)
// pairs; the cache is emptied when full.
const permCacheSize = 1024

// emptyContentHeader is a basic content header with body size 0 and no
// properties.
var emptyContentHeader = []byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

type permKey struct{ exchange, routingKey string }

// prober runs one connection's permission probes.
type prober struct {
	// sem (capacity 1) is held by the probe in progress: probes take turns
	// on the reserved channel.
	sem chan struct{}
	// answers receives RabbitMQ's methods on the reserved channel from the
	// upstream reader, which never blocks on it: a probe has at most three
	// answers outstanding.
	answers chan wire.Method

	// open and broken belong to the holder of sem.
	open   bool  // the reserved channel is open and in tx mode
	broken error // a probe was abandoned midway: later answers would be out of step

	mu      sync.Mutex // guards allowed
	allowed map[permKey]struct{}
}

func (p *prober) cached(k permKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.allowed[k]
	return ok
}

func (p *prober) remember(k permKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.allowed == nil || len(p.allowed) >= permCacheSize {
		p.allowed = make(map[permKey]struct{})
	}
	p.allowed[k] = struct{}{}
}

// probeSlot holds a session's prober, made on first use.
type probeSlot struct{ p atomic.Pointer[prober] }

func (s *probeSlot) get() *prober {
	if p := s.p.Load(); p != nil {
		return p
	}
	s.p.CompareAndSwap(nil, &prober{sem: make(chan struct{}, 1), answers: make(chan wire.Method, 4)})
	return s.p.Load()
}

// CheckPublish asks RabbitMQ whether the client's user may publish to
// exchange with routingKey on this connection's vhost (write permission,
// and topic permission on the key for topic exchanges). It returns nil
// when allowed, a *wire.Error with RabbitMQ's code and text when refused
// (403 ACCESS_REFUSED, or 404 NOT_FOUND when the exchange is missing), or
// another error when the connection ends or ctx is done first.
//
// Allowed pairs are cached per connection (up to 1024, then the cache is
// emptied); refusals are asked again. The routing key matters only for
// topic exchanges: pass "" for the others so they share one cache entry.
// A cache miss costs one round trip to RabbitMQ; ConnHooks.Publish may call
// it (the client's reading waits meanwhile).
func (c *Conn) CheckPublish(ctx context.Context, exchange, routingKey string) error {
	return c.s.checkPublish(ctx, exchange, routingKey)
}

func (s *session) checkPublish(ctx context.Context, exchange, routingKey string) error {
	p := s.probe.get()
	k := permKey{exchange, routingKey}
	if p.cached(k) {
		return nil
	}
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return errConnClosed
	}
	defer func() { <-p.sem }()
	if p.cached(k) {
		return nil
	}
	if p.broken != nil {
		return p.broken
	}
	ch := s.reserved
	if ch == 0 {
		return &wire.Error{Code: wire.AccessRefused, ClassID: 60, MethodID: 40,
			Text: "delayproxy cannot check publish permissions on a connection without a channel_max limit"}
	}
	var frames []byte
	var want [3]wire.MethodID
	n := 0
	if !p.open {
		frames = methodFrame(frames, ch, &wire.ChannelOpen{})
		frames = methodFrame(frames, ch, &wire.TxSelect{})
		want[0], want[1], n = wire.IDChannelOpenOk, wire.IDTxSelectOk, 2
	}
	frames = methodFrame(frames, ch, &wire.BasicPublish{Exchange: exchange, RoutingKey: routingKey})
	frames = wire.AppendFrame(frames, wire.Frame{Type: wire.FrameHeader, Channel: ch, Payload: emptyContentHeader})
	frames = methodFrame(frames, ch, &wire.TxRollback{})
	want[n] = wire.IDTxRollbackOk
	n++
	if !s.uw.q.pushNow(outItem{kind: itemLifecycle, buf: frames}) {
		return errConnClosed
	}
	for _, id := range want[:n] {
		var m wire.Method
		select {
		case m = <-p.answers:
		case <-ctx.Done():
			p.broken = fmt.Errorf("amqpproxy: permission probe abandoned: %w", ctx.Err())
			return ctx.Err()
		case <-s.done:
			return errConnClosed
		}
		if cm, ok := m.(*wire.ChannelClose); ok {
			p.open = false
			text, _ := strings.CutPrefix(cm.ReplyText, wire.ReplyText(cm.ReplyCode)+" - ")
			s.log.Info("publish refused by RabbitMQ", "exchange", exchange, "routing_key", routingKey, "code", cm.ReplyCode, "reason", text)
			return &wire.Error{Code: cm.ReplyCode, Text: text, ClassID: 60, MethodID: 40}
		}
		if m.ID() != id {
			p.broken = fmt.Errorf("amqpproxy: permission probe: RabbitMQ answered %v, want %v", m.ID(), id)
			return p.broken
		}
	}
	p.open = true
	p.remember(k)
	return nil
}

// reservedFrame handles a frame RabbitMQ sent on the reserved channel
// (upstream reader): a channel.close is answered at once, and every method
// goes to the probe waiting for it.
func (s *session) reservedFrame(f wire.Frame) {
	if f.Type != wire.FrameMethod {
		return
	}
	m, err := wire.DecodeMethod(f.Payload)
	if err != nil {
		return
	}
	if m.ID() == wire.IDChannelClose {
		s.uw.q.pushNow(outItem{kind: itemLifecycle, buf: methodFrame(nil, s.reserved, &wire.ChannelCloseOk{})})
	}
	p := s.probe.p.Load()
	if p == nil {
		return
	}
	select {
	case p.answers <- m:
	default:
	}
}
