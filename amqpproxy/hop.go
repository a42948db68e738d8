package amqpproxy

import (
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// side names a hop of the session by who is at its far end: the client or
// RabbitMQ. What is alike on both hops (relaying, channel 0) is written once
// and told which side a frame came from.
type side uint8

const (
	clientSide side = iota
	upstreamSide
)

func (d side) other() side { return d ^ 1 }

// closing is the connection state once this side sent connection.close.
func (d side) closing() uint32 {
	if d == clientSide {
		return connClientClosing
	}
	return connUpstreamClosing
}

// closedErr is why the session ended once this side's connection.close
// was answered.
func (d side) closedErr() error {
	if d == clientSide {
		return errClientClosed
	}
	return errUpstreamClosed
}

// relayUp queues a client frame for RabbitMQ, re-splitting a body frame
// larger than the upstream frame_max. It reports false once the upstream
// writer is gone.
func (s *session) relayUp(f wire.Frame, ch *Channel) bool {
	return relay(s.uw.q, &s.cArena, s.upMaxBody, f, ch)
}

// relayDown queues an upstream frame for the client, re-splitting a body
// frame larger than the client's frame_max. It reports false once the
// client writer is gone.
func (s *session) relayDown(f wire.Frame, ch *Channel) bool {
	return relay(s.cw.q, &s.uArena, s.downMaxBody, f, ch)
}

// relayFrom queues a frame read from side from for the other side.
func (s *session) relayFrom(from side, f wire.Frame, ch *Channel) bool {
	if from == clientSide {
		return s.relayUp(f, ch)
	}
	return s.relayDown(f, ch)
}

// relay queues a copy of f (carved from the reader's arena a) on q,
// re-splitting a body frame larger than maxBody. Only the reader that
// relays into q calls it: the frame waits for its wake (pushQuiet).
func relay(q *outQueue, a *arena, maxBody int, f wire.Frame, ch *Channel) bool {
	if f.Type == wire.FrameBody && len(f.Payload) > maxBody {
		return splitBody(q.pushQuiet, a, f, ch, maxBody)
	}
	return q.pushQuiet(outItem{kind: itemRelay, ch: ch, buf: a.frame(f.Type, f.Channel, f.Payload)})
}

// splitBody queues body frame f as frames of at most max payload bytes,
// each with push.
func splitBody(push func(outItem) bool, a *arena, f wire.Frame, ch *Channel, max int) bool {
	for p := f.Payload; len(p) > 0; {
		n := min(len(p), max)
		if !push(outItem{kind: itemRelay, ch: ch, buf: a.frame(wire.FrameBody, f.Channel, p[:n])}) {
			return false
		}
		p = p[n:]
	}
	return true
}

// sendTo queues a frame made by the proxy (a connection method) for side
// to; it never waits and is never dropped.
func (s *session) sendTo(to side, frame []byte) {
	w := s.cw
	if to == upstreamSide {
		w = s.uw
	}
	w.q.pushNow(outItem{kind: itemLifecycle, buf: frame})
}

// connFrame handles a frame on channel 0 read from side from. Every frame
// is relayed; connection.close marks the connection closing by that side,
// and the close-ok that answers the other side's close ends the session.
func (s *session) connFrame(from side, f wire.Frame) bool {
	if f.Type == wire.FrameMethod {
		switch id, _ := wire.PeekMethodID(f.Payload); id {
		case wire.IDConnectionClose:
			s.mu.Lock()
			if s.state.Load() == connRunning {
				s.state.Store(from.closing())
			}
			s.mu.Unlock()
			if from == upstreamSide {
				return s.upstreamClose(f)
			}
		case wire.IDConnectionCloseOk:
			if s.state.Load() == from.other().closing() {
				if from == upstreamSide {
					s.answeredClientClose()
				}
				ok := s.relayFrom(from, f, nil)
				s.stop(from.other().closedErr())
				return ok
			}
		}
	}
	return s.relayFrom(from, f, nil)
}

// whileClosing handles a frame read from side from while the proxy closes
// the connection: only that side's close-ok (or its own close, answered)
// matters now.
func (s *session) whileClosing(from side, f wire.Frame) bool {
	if f.Channel != 0 || f.Type != wire.FrameMethod {
		return true
	}
	switch id, _ := wire.PeekMethodID(f.Payload); id {
	case wire.IDConnectionCloseOk:
		s.closeOK(from)
	case wire.IDConnectionClose:
		if from == clientSide {
			s.answeredClientClose()
		}
		s.sendTo(from, methodFrame(nil, 0, &wire.ConnectionCloseOk{}))
		s.closeOK(from)
	}
	return true
}
