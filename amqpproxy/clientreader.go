package amqpproxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// clientLoop is the client reader: it runs in the handler goroutine.
func (s *session) clientLoop() {
	for {
		f, err := s.cr.ReadFrame()
		if err != nil {
			s.clientReadFailed(err)
			return
		}
		// busy and draining: see drained.
		s.busy.Store(true)
		ok := s.fromClient(f)
		if !s.cr.HasFrame() {
			s.uw.q.wake() // the frames of this read leave in one write
		}
		s.busy.Store(false)
		s.poke()
		if !ok {
			return
		}
	}
}

func (s *session) clientReadFailed(err error) {
	var we *wire.Error
	switch {
	case s.stopped():
	case errors.As(err, &we):
		// The stream is out of step: say why, read (and drop) what the
		// client still sends, so that closing the socket does not reset the
		// connection before the client has read connection.close, then
		// hang up.
		s.closeConn(we)
		s.drainClient()
		s.stop(we)
	case isTimeout(err):
		if s.state.Load() == connRunning {
			s.log.Info("client missed heartbeats, closing", "heartbeat", time.Duration(s.info.Heartbeat)*time.Second)
			s.stop(fmt.Errorf("client missed heartbeats: %w", err))
		} else {
			s.log.Info("no close-ok from client, closing")
			s.stop(errClientClosed)
		}
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
		if s.state.Load() == connRunning {
			s.log.Info("client closed the connection without connection.close")
		}
		s.stop(errClientClosed)
	default:
		s.log.Info("client read failed", "err", err)
		s.stop(fmt.Errorf("client: %w", err))
	}
}

// drainClient discards client bytes until the client hangs up, goes quiet
// for a moment, or the close timeout passes.
func (s *session) drainClient() {
	end := time.Now().Add(s.srv.cfg.CloseTimeout)
	buf := make([]byte, 32<<10)
	for {
		d := time.Now().Add(200 * time.Millisecond)
		if d.After(end) {
			d = end
		}
		s.client.setDeadline(d)
		if _, err := s.cr.Buffered().Read(buf); err != nil {
			return
		}
	}
}

// fromClient handles one client frame; false ends the client reader.
func (s *session) fromClient(f wire.Frame) bool {
	if f.Type == wire.FrameHeartbeat && f.Channel == 0 {
		return true
	}
	if s.state.Load() == connProxyClosing {
		return s.whileClosing(clientSide, f)
	}
	if f.Channel != 0 && s.draining.Load() {
		// Shutting down: only the rest of a content already begun.
		if ch := s.chans.get(f.Channel); ch == nil || ch.in.phase == inNone || f.Type == wire.FrameMethod {
			return true
		}
	}
	if f.Type == wire.FrameMethod && len(f.Payload) >= 4 {
		if id, _ := wire.PeekMethodID(f.Payload); !id.Known() {
			// RabbitMQ 3.10 hangs up without connection.close; so do we.
			s.log.Info("unknown method from client, closing", "method", id.String())
			s.stop(fmt.Errorf("client sent unknown method %v", id))
			return false
		}
	}
	if f.Channel == 0 {
		return s.connFrame(clientSide, f)
	}
	ch := s.chans.get(f.Channel)
	if ch == nil {
		if f.Type == wire.FrameMethod {
			if id, err := wire.PeekMethodID(f.Payload); err == nil && id == wire.IDChannelOpen {
				return s.openChannel(f)
			}
		}
		return s.relayUp(f, nil) // RabbitMQ answers 504 or 505, as it would
	}
	switch f.Type {
	case wire.FrameMethod:
		return s.clientMethod(ch, f)
	case wire.FrameHeader, wire.FrameBody:
		return s.clientContent(ch, f)
	}
	return s.relayUp(f, ch)
}

// openChannel handles channel.open for a free channel number. RabbitMQ
// judges it (channel_max, per-user channel limits) with the client's own
// tuning, and closes the connection with 530 as it would.
func (s *session) openChannel(f wire.Frame) bool {
	id := f.Channel
	ch := &Channel{id: id, s: s}
	s.chans.set(id, ch)
	s.open.Add(1)
	s.srv.cfg.Metrics.ChannelsOpened(1)
	return s.relayUp(f, ch)
}

// clientMethod handles a client method frame on an open channel number.
func (s *session) clientMethod(ch *Channel, f wire.Frame) bool {
	id, err := wire.PeekMethodID(f.Payload)
	if err != nil {
		ch.in = contentIn{}
		return s.relayUp(f, ch) // RabbitMQ answers 501
	}
	if ch.in.phase != inNone {
		if ch.in.pub != nil {
			s.closeConn(unexpectedFrame(ch.in.phase, f, 60, 40))
			return true
		}
		if ch.in.held != nil && !s.releaseHeld(ch) {
			return false
		}
		ch.in = contentIn{} // relayed: RabbitMQ answers 505
	}
	switch st := ch.state.Load(); st {
	case chOpen:
	case chProxyClosing, chProxyClosingClient, chClosed:
		s.clientMethodProxyClosing(ch, id)
		return true
	default: // closing by the client or by RabbitMQ: relay, RabbitMQ decides
		if wire.HasContent(id) {
			ch.in = contentIn{phase: inHeader, relay: true}
		}
		ok := s.relayUp(f, ch)
		if id == wire.IDChannelCloseOk && st == chServerClosing {
			s.freeChannel(ch)
		}
		return ok
	}
	switch id {
	case wire.IDBasicPublish:
		return s.clientPublish(ch, f)
	case wire.IDChannelClose:
		return s.clientChannelClose(ch, f)
	case wire.IDChannelOpen, wire.IDChannelCloseOk:
		return s.relayUp(f, ch)
	case wire.IDConfirmSelect:
		ch.mu.Lock()
		if ch.confirms == nil {
			ch.confirms = newConfirms()
		}
		ch.mu.Unlock()
	case wire.IDTxSelect:
		ch.mu.Lock()
		ch.tx = true
		ch.mu.Unlock()
		ch.acks.stop()
	case wire.IDBasicAck, wire.IDBasicNack, wire.IDBasicReject:
		if ch.acks.settle(id, f.Payload) {
			return s.uw.q.pushQuiet(outItem{kind: itemRelay, ch: ch, foldable: true,
				buf: s.cArena.frame(wire.FrameMethod, ch.id, f.Payload)})
		}
	case wire.IDBasicConsume, wire.IDBasicGet, wire.IDBasicRecover, wire.IDBasicRecoverAsync:
		ch.acks.method(id, f.Payload)
	}
	if s.hooks != nil {
		return s.clientMethodHooked(ch, id, f)
	}
	return s.relayUp(f, ch)
}

// clientChannelClose handles the client's channel.close on an open
// channel. While publishes taken over on the channel are unanswered, the
// close waits, so that their answers (a refusal among them) reach the
// client before its close does its work, as RabbitMQ judges a publish
// before the close behind it; the last answer applies it (publishAnswered).
func (s *session) clientChannelClose(ch *Channel, f wire.Frame) bool {
	ch.mu.Lock()
	if ch.state.Load() == chOpen && ch.taken > 0 {
		ch.heldClose = wire.AppendFrame(nil, f)
		ch.mu.Unlock()
		return true
	}
	ch.mu.Unlock()
	return s.applyClientClose(ch, func() bool { return s.relayUp(f, ch) })
}

// applyClientClose is the client's channel.close taking effect on ch:
// relayed (by relay) when the channel is open or closing by RabbitMQ's
// or the client's doing; while the proxy closes it, a crossing close,
// answered as RabbitMQ answers one (see proxyCloseUpstreamDone).
func (s *session) applyClientClose(ch *Channel, relay func() bool) bool {
	ch.mu.Lock()
	switch ch.state.Load() {
	case chOpen:
		ch.state.Store(chClientClosing)
		waiting := ch.takeWaitingLocked()
		ch.mu.Unlock()
		ch.failReplies(waiting, nil)
		return relay()
	case chClientClosing, chServerClosing:
		ch.mu.Unlock()
		return relay() // RabbitMQ decides
	case chProxyClosing:
		ch.clientClosed = true
	case chProxyClosingClient: // crossing closes: answer it, still wait for ours
		s.cw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelCloseOk{})})
	}
	ch.mu.Unlock()
	return true
}

// clientMethodProxyClosing: the proxy is closing ch; the client's frames are
// dropped except its close and close-ok.
func (s *session) clientMethodProxyClosing(ch *Channel, id wire.MethodID) {
	switch id {
	case wire.IDChannelClose:
		s.applyClientClose(ch, func() bool { return true }) // never relayed in these states
	case wire.IDChannelCloseOk:
		if ch.state.Load() == chProxyClosingClient {
			s.freeChannel(ch)
		}
	default:
		if wire.HasContent(id) {
			ch.in = contentIn{phase: inHeader} // drop the content too
		}
	}
}

// clientPublish handles basic.publish on an open channel.
func (s *session) clientPublish(ch *Channel, f wire.Frame) bool {
	if s.hooks != nil {
		var m wire.BasicPublish
		if err := m.Decode(f.Payload[4:]); err == nil {
			s.uw.q.wake() // a hook may wait for what was relayed before
			if claim, ok := s.hooks.InterceptsPublish(ch, &m); ok {
				ch.in = contentIn{phase: inHeader, pub: &Publish{Channel: ch, Message: Message{Publish: m}, Claim: claim,
					methodPayload: append([]byte(nil), f.Payload...)}}
				return true
			}
			// Its content header may still ask for it (InterceptsContent):
			// the method frame waits for it, and so does the confirm tag,
			// so that the message's frames go upstream together and tags
			// stay in publish order.
			ch.in = contentIn{phase: inHeader, relay: true, held: s.cArena.frame(wire.FrameMethod, ch.id, f.Payload), heldPub: m}
			return true
		}
	}
	ch.in = contentIn{phase: inHeader, relay: true}
	if ch.inConfirm() {
		ch.mu.Lock()
		ch.confirms.relay(ch.confirms.publish())
		ch.mu.Unlock()
	}
	return s.relayUp(f, ch)
}

// heldContent decides a publish whose method frame is held (clientPublish)
// on its first content frame f: a content header whose properties carry a
// headers table is offered to ConnHooks.InterceptsContent, and a publish it
// takes is assembled from here on like one taken at basic.publish; any
// other goes upstream, its method frame first. It reports false once the
// upstream writer is gone.
func (s *session) heldContent(ch *Channel, f wire.Frame) bool {
	in := &ch.in
	if f.Type == wire.FrameHeader && len(f.Payload) > 12 && f.Payload[12]&headersFlagHigh != 0 && ch.state.Load() == chOpen {
		s.uw.q.wake() // a hook may wait for what was relayed before
		if claim, ok := s.hooks.InterceptsContent(ch, &in.heldPub, f.Payload[12:]); ok {
			held := in.held
			*in = contentIn{phase: inHeader, pub: &Publish{Channel: ch, Message: Message{Publish: in.heldPub}, Claim: claim,
				methodPayload: append([]byte(nil), held[7:len(held)-1]...)}} // not the arena's: it may wait long
			return true
		}
	}
	return s.releaseHeld(ch)
}

// headersFlagHigh is the headers property's bit (0x2000) in the high byte
// of a content header's first property flags word.
const headersFlagHigh = byte(wire.FlagHeaders >> 8)

// releaseHeld sends the held method frame of ch's publish upstream, with
// its confirm tags, now that InterceptsContent will not take it.
func (s *session) releaseHeld(ch *Channel) bool {
	held := ch.in.held
	ch.in.held = nil
	if ch.inConfirm() {
		ch.mu.Lock()
		ch.confirms.relay(ch.confirms.publish())
		ch.mu.Unlock()
	}
	return s.uw.q.pushQuiet(outItem{kind: itemRelay, ch: ch, buf: held})
}

// inConfirm reports whether ch is in confirm mode; client reader only (it
// is the goroutine that sets confirms).
func (ch *Channel) inConfirm() bool { return ch.confirms != nil }

// clientContent handles a content header or body frame from the client.
func (s *session) clientContent(ch *Channel, f wire.Frame) bool {
	in := &ch.in
	switch in.phase {
	case inNone:
		if ch.state.Load() >= chProxyClosing {
			return true // the channel is going or gone upstream
		}
		return s.relayUp(f, ch) // RabbitMQ answers 505
	case inHeader:
		if in.held != nil && !s.heldContent(ch, f) {
			return false
		}
		if f.Type != wire.FrameHeader {
			if in.pub != nil {
				s.closeConn(unexpectedFrame(inHeader, f, 60, 40))
				return true
			}
			*in = contentIn{}
			return s.relayUp(f, ch)
		}
		size, ok := bodySize(f.Payload)
		if in.pub != nil {
			switch {
			case !ok:
				s.closeConn(&wire.Error{Code: wire.FrameError, Text: fmt.Sprintf("type 2, all octets = %v: unknown_frame", erlBinary(f.Payload))})
				return true
			case binary.BigEndian.Uint16(f.Payload) != 60:
				s.closeConn(&wire.Error{Code: wire.UnexpectedFrame, ClassID: 60, MethodID: 40,
					Text: fmt.Sprintf("expected content header for class 60, got one for class %d instead", binary.BigEndian.Uint16(f.Payload))})
				return true
			case size > uint64(s.srv.cfg.MaxMessageSize):
				s.srv.cfg.Metrics.PublishTooLarge()
				ch.closeByProxy(&wire.Error{Code: wire.PreconditionFailed, ClassID: 60, MethodID: 40,
					Text: fmt.Sprintf("message size %d is larger than configured max size %d", size, s.srv.cfg.MaxMessageSize)})
				in.pub = nil
			default:
				in.pub.Header = append([]byte(nil), f.Payload...)
			}
		}
		if !ok || size == 0 {
			relay := in.relay
			s.contentDone(ch)
			if relay {
				return s.relayUp(f, ch)
			}
			return true
		}
		in.phase, in.remaining = inBody, size
		if in.relay {
			return s.relayUp(f, ch)
		}
		return true
	default: // inBody
		if f.Type != wire.FrameBody {
			if in.pub != nil {
				s.closeConn(unexpectedFrame(inBody, f, 60, 40))
				return true
			}
			*in = contentIn{}
			return s.relayUp(f, ch)
		}
		n := uint64(len(f.Payload))
		if n > in.remaining {
			if in.pub != nil {
				s.closeConn(&wire.Error{Code: wire.FrameError, ClassID: 60, MethodID: 40,
					Text: fmt.Sprintf("body frame of %d bytes exceeds the %d bytes left of the content", n, in.remaining)})
				return true
			}
			*in = contentIn{}
			return s.relayUp(f, ch)
		}
		in.remaining -= n
		if in.pub != nil {
			if in.body == nil {
				in.body = make([]byte, 0, min(in.remaining+n, 1<<20))
			}
			in.body = append(in.body, f.Payload...)
		}
		ok := true
		if in.relay {
			ok = s.relayUp(f, ch)
		}
		if in.remaining == 0 {
			s.contentDone(ch)
		}
		return ok
	}
}
