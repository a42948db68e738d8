package amqpproxy

import (
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// relayUp queues a client frame for RabbitMQ, re-splitting a body frame
// larger than the upstream frame_max. It reports false once the upstream
// writer is gone.
func (s *session) relayUp(f wire.Frame, ch *Channel) bool {
	if f.Type == wire.FrameBody && len(f.Payload) > s.upMaxBody {
		return s.splitBody(s.uw.q, &s.cArena, f, ch, s.upMaxBody)
	}
	return s.uw.q.push(outItem{kind: itemRelay, ch: ch, buf: s.cArena.frame(f.Type, f.Channel, f.Payload)})
}

// relayDown queues an upstream frame for the client.
func (s *session) relayDown(f wire.Frame, ch *Channel) bool {
	if f.Type == wire.FrameBody && len(f.Payload) > s.downMaxBody {
		return s.splitBody(s.cw.q, &s.uArena, f, ch, s.downMaxBody)
	}
	return s.cw.q.push(outItem{kind: itemRelay, ch: ch, buf: s.uArena.frame(f.Type, f.Channel, f.Payload)})
}

func (s *session) splitBody(q *outQueue, a *arena, f wire.Frame, ch *Channel, max int) bool {
	for p := f.Payload; len(p) > 0; {
		n := min(len(p), max)
		if !q.push(outItem{kind: itemRelay, ch: ch, buf: a.frame(wire.FrameBody, f.Channel, p[:n])}) {
			return false
		}
		p = p[n:]
	}
	return true
}

// clientWhileClosing: the proxy is closing the connection; only the
// client's close-ok (or its own close) matters now.
func (s *session) clientWhileClosing(f wire.Frame) bool {
	if f.Channel != 0 || f.Type != wire.FrameMethod {
		return true
	}
	switch id, _ := wire.PeekMethodID(f.Payload); id {
	case wire.IDConnectionCloseOk:
		s.closeOK(true)
	case wire.IDConnectionClose:
		s.sendClient(methodFrame(nil, 0, &wire.ConnectionCloseOk{}))
		s.closeOK(true)
	}
	return true
}

// clientConnFrame handles a client frame on channel 0.
func (s *session) clientConnFrame(f wire.Frame) bool {
	if f.Type == wire.FrameMethod {
		id, _ := wire.PeekMethodID(f.Payload)
		switch id {
		case wire.IDConnectionClose:
			s.mu.Lock()
			if s.state.Load() == connRunning {
				s.state.Store(connClientClosing)
			}
			s.mu.Unlock()
		case wire.IDConnectionCloseOk:
			if s.state.Load() == connUpstreamClosing {
				ok := s.relayUp(f, nil)
				s.stop(errUpstreamClosed)
				return ok
			}
		}
	}
	return s.relayUp(f, nil)
}

// upstreamConnFrame handles an upstream frame on channel 0.
func (s *session) upstreamConnFrame(f wire.Frame) bool {
	if f.Type == wire.FrameMethod {
		id, _ := wire.PeekMethodID(f.Payload)
		switch id {
		case wire.IDConnectionClose:
			s.mu.Lock()
			if s.state.Load() == connRunning {
				s.state.Store(connUpstreamClosing)
			}
			s.mu.Unlock()
			var cm wire.ConnectionClose
			if cm.Decode(f.Payload[4:]) == nil {
				s.log.Info("upstream closed the connection", "code", cm.ReplyCode, "reason", cm.ReplyText)
				s.mu.Lock()
				if s.reason == nil {
					s.reason = &wire.Error{Code: cm.ReplyCode, Text: cm.ReplyText, ClassID: cm.ClassID, MethodID: cm.MethodID}
				}
				s.mu.Unlock()
			}
			ok := s.relayDown(f, nil)
			s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
			return ok
		case wire.IDConnectionCloseOk:
			if s.state.Load() == connClientClosing {
				ok := s.relayDown(f, nil)
				s.stop(errClientClosed)
				return ok
			}
		}
	}
	return s.relayDown(f, nil)
}

// upstreamWhileClosing: the proxy is closing the connection; only
// RabbitMQ's close-ok (or its own close) matters now.
func (s *session) upstreamWhileClosing(f wire.Frame) bool {
	if f.Channel != 0 || f.Type != wire.FrameMethod {
		return true
	}
	switch id, _ := wire.PeekMethodID(f.Payload); id {
	case wire.IDConnectionCloseOk:
		s.closeOK(false)
	case wire.IDConnectionClose:
		s.uw.q.pushNow(outItem{kind: itemLifecycle, buf: methodFrame(nil, 0, &wire.ConnectionCloseOk{})})
		s.closeOK(false)
	}
	return true
}
