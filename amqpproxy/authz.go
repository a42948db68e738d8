package amqpproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// Publish permission probes.
//
// A message the proxy takes over is published later by the proxy's own
// account, so RabbitMQ never judges the client's right to publish it. The
// proxy asks RabbitMQ instead, over a connection of its own for the client
// (probeconn.go): dialled on the first check, logged in with the client's
// own mechanism and response on the client's vhost, closed with the
// session. It takes no channel number of the client's connection, so the
// client is offered RabbitMQ's channel_max; a client that publishes no
// delayed message costs nothing. On the probe connection's channel 1:
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
// channel at the first failure.

// permCacheSize bounds a connection's cache of allowed (exchange, key)
// pairs; the cache is emptied when full.
const permCacheSize = 1024

type permKey struct{ exchange, routingKey string }

// prober runs one session's permission probes.
type prober struct {
	// sem (capacity 1) is held by the probe in progress, which owns pc:
	// probes take turns on the probe connection.
	sem chan struct{}
	pc  *probeConn // nil until dialled, and after it failed

	mu      sync.Mutex // guards the fields below
	allowed map[permKey]struct{}
	active  *probeConn // pc, for abort from another goroutine
	aborted bool       // Server.Close: dial nothing more, close at once
}

func newProber() prober { return prober{sem: make(chan struct{}, 1)} }

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

// CheckPublish asks RabbitMQ whether the client's user may publish to
// exchange with routingKey on this connection's vhost (write permission,
// and topic permission on the key for topic exchanges). It returns nil
// when allowed, a *wire.Error with RabbitMQ's code and text when refused
// (403 ACCESS_REFUSED, or 404 NOT_FOUND when the exchange is missing; and
// RabbitMQ's answer when it refuses the probe connection's login, as
// for a changed password or a connection limit), or another error when
// RabbitMQ cannot be asked, the connection ends or ctx is done first.
//
// Allowed pairs are cached per connection (up to 1024, then the cache is
// emptied); refusals are asked again. The routing key matters only for
// topic exchanges: pass "" for the others so they share one cache entry.
// A cache miss costs one round trip to RabbitMQ, and the first one of a
// connection a few more (the probe connection's handshake); ConnHooks.Publish
// may call it (the client's reading waits meanwhile).
func (c *Conn) CheckPublish(ctx context.Context, exchange, routingKey string) error {
	return c.s.checkPublish(ctx, exchange, routingKey)
}

func (s *session) checkPublish(ctx context.Context, exchange, routingKey string) error {
	p := &s.probe
	k := permKey{exchange, routingKey}
	if p.cached(k) {
		return nil
	}
	// The probe ends with the session too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return s.probeFailed(ctx, ctx.Err())
	}
	defer func() { <-p.sem }()
	if p.cached(k) {
		return nil
	}
	for attempt := 0; ; attempt++ {
		fresh := p.pc == nil
		if fresh {
			pc, err := s.dialProbe(ctx)
			if err != nil {
				return s.probeFailed(ctx, err)
			}
			p.setConn(pc)
		}
		err := p.pc.probe(ctx, s.srv.cfg.HandshakeTimeout, k)
		var we *wire.Error
		switch {
		case err == nil:
			p.remember(k)
			return nil
		case errors.As(err, &we):
			text, _ := strings.CutPrefix(we.Text, wire.ReplyText(we.Code)+" - ")
			s.log.Info("publish refused by RabbitMQ", "exchange", exchange, "routing_key", routingKey, "code", we.Code, "reason", text)
			return &wire.Error{Code: we.Code, Text: text, ClassID: 60, MethodID: 40}
		}
		// The probe connection is out of step or gone (RabbitMQ closed it,
		// the socket died while idle): a new one, once.
		p.dropConn()
		if fresh || attempt > 0 || ctx.Err() != nil {
			return s.probeFailed(ctx, err)
		}
	}
}

// probeFailed is the error of a probe that could not ask RabbitMQ.
func (s *session) probeFailed(ctx context.Context, err error) error {
	var we *wire.Error
	switch {
	case errors.As(err, &we): // RabbitMQ refused the probe connection
		text, _ := strings.CutPrefix(we.Text, wire.ReplyText(we.Code)+" - ")
		s.log.Info("permission probe refused by RabbitMQ", "code", we.Code, "reason", text)
		return &wire.Error{Code: we.Code, Text: text, ClassID: 60, MethodID: 40}
	case s.stopped():
		return errConnClosed
	case ctx.Err() != nil:
		return ctx.Err()
	}
	s.log.Warn("cannot check publish permission", "upstream", s.srv.up.HostPort, "err", err)
	return fmt.Errorf("amqpproxy: permission probe: %w", err)
}

// setConn makes pc the probe connection; after Server.Close it is closed
// at once.
func (p *prober) setConn(pc *probeConn) {
	p.mu.Lock()
	p.pc, p.active = pc, pc
	aborted := p.aborted
	p.mu.Unlock()
	if aborted {
		pc.c.Close()
	}
}

// dropConn closes a probe connection that failed.
func (p *prober) dropConn() {
	p.mu.Lock()
	pc := p.pc
	p.pc, p.active = nil, nil
	p.mu.Unlock()
	if pc != nil {
		pc.c.Close()
	}
}

// abort closes the probe connection at once (Server.Close).
func (p *prober) abort() {
	p.mu.Lock()
	p.aborted = true
	pc := p.active
	p.mu.Unlock()
	if pc != nil {
		pc.c.Close()
	}
}

// close closes the probe connection, if there is one, as a client does
// (connection.close, RabbitMQ's close-ok) within the close timeout. It
// runs when the session has ended: no probe is in progress or can start.
func (p *prober) close(closeTimeout time.Duration) {
	p.sem <- struct{}{}
	defer func() { <-p.sem }()
	p.mu.Lock()
	pc, aborted := p.pc, p.aborted
	p.pc, p.active = nil, nil
	p.mu.Unlock()
	switch {
	case pc == nil:
	case aborted:
		pc.c.Close()
	default:
		pc.close(closeTimeout)
	}
}
