package amqpproxy

import (
	"encoding/binary"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// upstreamLoop is the upstream reader.
func (s *session) upstreamLoop() {
	for {
		f, err := s.ur.ReadFrame()
		if err != nil {
			s.upstreamReadFailed(err)
			return
		}
		ok := s.fromUpstream(f)
		if !s.ur.HasFrame() {
			s.cw.q.wake() // the frames of this read leave in one write
		}
		if !ok {
			return
		}
	}
}

func (s *session) upstreamReadFailed(err error) {
	if s.stopped() {
		return
	}
	s.mu.Lock()
	prev := s.state.Load()
	s.state.Store(connProxyClosing)
	s.hopDone[upstreamSide] = true
	clientOK := s.hopDone[clientSide]
	s.mu.Unlock()
	s.uw.q.close()
	switch prev {
	case connRunning:
		reason := "upstream connection lost"
		if isTimeout(err) {
			reason = "upstream missed heartbeats"
		}
		s.log.Warn(reason+", closing the client connection", "upstream", s.srv.up.HostPort, "err", err)
		s.sendTo(clientSide, connCloseFrame(&wire.Error{Code: wire.ConnectionForced, Text: "delayproxy: " + reason}))
		s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
	case connClientClosing:
		s.answeredClientClose()
		s.sendTo(clientSide, methodFrame(nil, 0, &wire.ConnectionCloseOk{}))
		s.stop(errClientClosed)
	case connUpstreamClosing:
		s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
	case connProxyClosing:
		if clientOK {
			s.stop(s.endReason())
		}
	}
}

// fromUpstream handles one upstream frame; false ends the upstream reader.
func (s *session) fromUpstream(f wire.Frame) bool {
	if f.Type == wire.FrameHeartbeat {
		return true
	}
	if s.state.Load() == connProxyClosing {
		return s.whileClosing(upstreamSide, f)
	}
	if f.Channel == 0 {
		return s.connFrame(upstreamSide, f)
	}
	ch := s.chans.get(f.Channel)
	if ch == nil {
		return s.relayDown(f, nil)
	}
	if f.Type != wire.FrameMethod {
		return s.upstreamContent(ch, f)
	}
	id, err := wire.PeekMethodID(f.Payload)
	if err != nil {
		return s.relayDown(f, ch)
	}
	ch.up = contentIn{}
	if wire.HasContent(id) {
		ch.up = contentIn{phase: inHeader, relay: true}
	}
	st := ch.state.Load()
	switch st {
	case chProxyClosing:
		switch id {
		case wire.IDChannelCloseOk:
			s.proxyCloseUpstreamDone(ch)
		case wire.IDChannelClose: // crossing closes: answer, keep waiting for ours
			s.uw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelCloseOk{})})
		}
		ch.up.relay = false
		return true
	case chProxyClosingClient, chClosed:
		ch.up.relay = false
		return true
	}
	switch id {
	case wire.IDBasicAck, wire.IDBasicNack:
		if len(f.Payload) == 13 {
			return s.cw.q.push(outItem{kind: itemConfirm, ch: ch, tag: binary.BigEndian.Uint64(f.Payload[4:12]),
				multiple: f.Payload[12]&1 != 0, nack: id == wire.IDBasicNack})
		}
	case wire.IDChannelClose:
		ch.mu.Lock()
		switch ch.state.Load() {
		case chProxyClosing: // the proxy began closing it meanwhile: crossing closes
			ch.mu.Unlock()
			s.uw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelCloseOk{})})
			return true
		case chOpen, chClientClosing:
			ch.state.Store(chServerClosing)
		}
		waiting := ch.takeWaitingLocked()
		ch.mu.Unlock()
		s.poke() // its confirms are no longer owed
		if len(waiting) > 0 {
			var e error = errChannelClosed
			var cm wire.ChannelClose
			if cm.Decode(f.Payload[4:]) == nil {
				e = &wire.Error{Code: cm.ReplyCode, Text: cm.ReplyText, ClassID: cm.ClassID, MethodID: cm.MethodID}
			}
			ch.failReplies(waiting, e)
		}
		return s.relayDown(f, ch)
	case wire.IDChannelCloseOk:
		if st == chClientClosing {
			s.freeChannel(ch)
		}
		return s.relayDown(f, ch)
	case wire.IDChannelOpenOk:
		return s.relayDown(f, ch)
	case wire.IDBasicDeliver, wire.IDBasicGetOk:
		ch.acks.delivery(id, f.Payload)
	}
	if s.hooks != nil && st == chOpen {
		if _, ok := wire.RequestOf(id); ok {
			return s.upstreamReply(ch, id, f)
		}
	}
	return s.relayDown(f, ch)
}

// upstreamContent handles a content header or body frame from RabbitMQ;
// contents of channels the proxy is closing are dropped.
func (s *session) upstreamContent(ch *Channel, f wire.Frame) bool {
	in := &ch.up
	relay := in.relay || in.phase == inNone
	switch in.phase {
	case inHeader:
		if size, ok := bodySize(f.Payload); f.Type != wire.FrameHeader || !ok || size == 0 {
			*in = contentIn{}
		} else {
			in.phase, in.remaining = inBody, size
		}
	case inBody:
		if n := uint64(len(f.Payload)); f.Type != wire.FrameBody || n >= in.remaining {
			*in = contentIn{}
		} else {
			in.remaining -= n
		}
	}
	if relay {
		return s.relayDown(f, ch)
	}
	return true
}

// upstreamClose relays RabbitMQ's connection.close (see connFrame): its
// code and text become the session's end reason, and the client has the
// close timeout to answer it.
func (s *session) upstreamClose(f wire.Frame) bool {
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
}

// proxyCloseUpstreamDone: RabbitMQ answered the proxy's channel.close; now
// the client is told, and the proxy waits for its close-ok. If the client
// closed the channel itself meanwhile (crossing closes), its close is
// answered too, after the proxy's, as RabbitMQ answers a close that
// crosses its own: channel.close with the error, then channel.close-ok.
func (s *session) proxyCloseUpstreamDone(ch *Channel) {
	ch.mu.Lock()
	ch.state.Store(chProxyClosingClient)
	e := ch.closeErr
	s.cw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelClose{
		ReplyCode: e.Code, ReplyText: replyText(e), ClassID: e.ClassID, MethodID: e.MethodID})})
	if ch.clientClosed {
		s.cw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelCloseOk{})})
	}
	ch.mu.Unlock()
}

// upstreamReply matches RabbitMQ's answer to the oldest request waiting on
// ch, lets its hook see it, and sends answers to the client in order.
func (s *session) upstreamReply(ch *Channel, id wire.MethodID, f wire.Frame) bool {
	ch.mu.Lock()
	var p *pending
	for i := 0; i < ch.replies.len(); i++ {
		if q := *ch.replies.at(i); q.state == pendWaiting {
			p = q
			break
		}
	}
	if p == nil {
		ch.mu.Unlock()
		return s.relayDown(f, ch)
	}
	if wire.HasContent(id) {
		// basic.get-ok: its content follows at once, so it is relayed now.
		p.state = pendDone
		ch.flushRepliesLocked()
		ch.mu.Unlock()
		return s.relayDown(f, ch)
	}
	p.frame = s.uArena.frame(wire.FrameMethod, ch.id, f.Payload)
	if p.onReply == nil {
		p.state = pendReady
		ch.flushRepliesLocked()
		ch.mu.Unlock()
		return true
	}
	p.state = pendHeld
	ch.mu.Unlock()
	r := &Reply{Channel: ch, Request: p.request, p: p}
	m, err := wire.DecodeMethod(f.Payload)
	if err != nil {
		r.Pass()
		return true
	}
	r.Method = m
	s.cw.q.wake() // a hook may wait for what was relayed before
	p.onReply(r)
	return true
}
