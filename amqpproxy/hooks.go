package amqpproxy

import "github.com/delayproxy/delayproxy/amqpproxy/wire"

// contentDone ends the client content in progress on ch, handing an
// assembled publish to the interceptor.
func (s *session) contentDone(ch *Channel) {
	p, body := ch.in.pub, ch.in.body
	ch.in = contentIn{}
	if p == nil || ch.state.Load() != chOpen {
		return
	}
	p.Body = body
	ch.mu.Lock()
	if ch.confirms != nil {
		p.Tag = ch.confirms.publish()
	}
	ch.taken++
	ch.mu.Unlock()
	if s.recv != nil {
		p.Received = s.recv.lastRecv()
	}
	p.inHook = true
	s.hookPending.Add(1)
	s.uw.q.wake() // a hook may wait for what was relayed before
	s.hooks.Publish(p)
	p.inHook = false
}

// relayPublish sends an assembled publish upstream (Publish.Relay).
func (s *session) relayPublish(p *Publish) {
	ch := p.Channel
	if p.Tag != 0 {
		ch.mu.Lock()
		ch.confirms.relay(p.Tag)
		ch.mu.Unlock()
	}
	q := s.uw.q
	q.push(outItem{kind: itemRelay, ch: ch, buf: s.cArena.frame(wire.FrameMethod, ch.id, p.methodPayload)})
	q.push(outItem{kind: itemRelay, ch: ch, buf: s.cArena.frame(wire.FrameHeader, ch.id, p.Header)})
	splitBody(q.push, &s.cArena, wire.Frame{Type: wire.FrameBody, Channel: ch.id, Payload: p.Body}, ch, s.upMaxBody)
}

// clientMethodHooked relays a method on a connection with hooks: listed
// methods go to the hook; synchronous requests are remembered so that
// replies can be matched and kept in order.
func (s *session) clientMethodHooked(ch *Channel, id wire.MethodID, f wire.Frame) bool {
	if s.hookMethods[id] {
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			return s.relayUp(f, ch) // RabbitMQ refuses it as it would
		}
		call := &Call{Channel: ch, Method: m, payload: f.Payload}
		s.uw.q.wake() // a hook may wait for what was relayed before
		s.hooks.Method(call)
		if !call.decided {
			call.Relay(nil, nil)
		}
		return !s.stopped()
	}
	if wire.IsSynchronousRequest(id) && !payloadNoWait(id, f.Payload) {
		s.expectReply(ch, nil, nil)
	}
	return s.relayUp(f, ch)
}

func (s *session) expectReply(ch *Channel, req wire.Method, onReply func(*Reply)) {
	ch.mu.Lock()
	ch.replies.push(&pending{request: req, onReply: onReply})
	ch.mu.Unlock()
}

// relayCall relays a hooked call (Call.Relay).
func (s *session) relayCall(c *Call, m wire.Method, onReply func(*Reply)) {
	ch := c.Channel
	var frame []byte
	var sync bool
	if m == nil {
		m = c.Method
		frame = s.cArena.frame(wire.FrameMethod, ch.id, c.payload)
	} else {
		frame = methodFrame(nil, ch.id, m)
	}
	sync = wire.IsSynchronousRequest(m.ID()) && !methodNoWait(m)
	if sync {
		s.expectReply(ch, m, onReply)
	}
	s.uw.q.push(outItem{kind: itemRelay, ch: ch, buf: frame})
}

// answerCall answers a hooked call locally (Call.Answer), in turn with the
// channel's other replies.
func (s *session) answerCall(c *Call, m wire.Method) {
	ch := c.Channel
	ch.mu.Lock()
	ch.replies.push(&pending{request: c.Method, state: pendReady, frame: methodFrame(nil, ch.id, m)})
	ch.flushRepliesLocked()
	ch.mu.Unlock()
}
