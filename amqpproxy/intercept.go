package amqpproxy

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// Interceptor lets a layer above the relay (the delayed-exchange layer) take
// part in chosen client traffic. A Server whose Interceptor is nil is a pure
// relay.
type Interceptor interface {
	// Open is called once per client connection, when its handshake with
	// the client and RabbitMQ is complete, before any channel frame is read.
	// It returns the connection's hooks, or nil to relay the connection
	// untouched.
	Open(c *Conn) ConnHooks
}

// ConnHooks are one client connection's interception points.
//
// Methods, Method, InterceptsPublish and Publish run in the connection's
// client reader goroutine, in the order the client sent the frames. They
// may block only to apply back-pressure or for a Conn.CheckPublish round
// trip (reading from that client stops meanwhile), and must then give up
// when Conn.Done is closed. Reply hooks
// (see Call.Relay) run in the upstream reader goroutine and must not block.
type ConnHooks interface {
	// Methods lists the client methods passed to Method. Channel-0 methods,
	// channel.open, channel.close, channel.close-ok, confirm.select,
	// tx.select and basic.publish are the session's own and never passed;
	// every method not listed is relayed byte for byte.
	Methods() []wire.MethodID

	// Method is called for each listed method the client sends on an open
	// channel. It must call exactly one of call.Relay, call.Answer or
	// call.CloseChannel before it returns; if it calls none, the method is
	// relayed unchanged.
	Method(call *Call)

	// InterceptsPublish reports whether a basic.publish on an open channel
	// is to be assembled (method, content header, body) and given to
	// Publish instead of being relayed frame by frame. claim is whatever
	// the hooks learnt deciding it (the delayed layer's registry record),
	// handed to Publish as Publish.Claim so it is not looked up again.
	InterceptsPublish(ch *Channel, m *wire.BasicPublish) (claim any, ok bool)

	// InterceptsContent is asked about a basic.publish on an open channel
	// that InterceptsPublish did not take, once its content header is in,
	// and only when the header's properties carry a headers table: props
	// is the property flags and list, byte for byte (read it, never keep
	// it). A publish it takes (ok) is assembled and given to Publish, with
	// claim, as one taken at basic.publish. Meanwhile the proxy holds the
	// method frame, so the message's frames go upstream together either
	// way.
	InterceptsContent(ch *Channel, m *wire.BasicPublish, props []byte) (claim any, ok bool)

	// Publish receives an assembled publish chosen by InterceptsPublish or
	// InterceptsContent.
	// Before it returns it either calls p.Relay (the message goes upstream
	// after all, in order), or takes the message over and later (from any
	// goroutine) calls exactly one of p.Ack, p.Nack or p.CloseChannel.
	Publish(p *Publish)

	// Closed is called once, after the connection ended and every other
	// hook call (including reply hooks) has returned.
	Closed(err error)
}

// Conn describes a client connection to the interceptor.
type Conn struct {
	VHost            string
	User             string
	ClientProperties wire.Table // exactly as the client sent them
	RemoteAddr       net.Addr
	ChannelMax       uint16 // negotiated on both hops; 0: no limit
	FrameMax         uint32 // negotiated on both hops
	Heartbeat        uint16 // seconds, negotiated on both hops; 0: none

	s *session
}

// Done is closed when the connection is ending.
func (c *Conn) Done() <-chan struct{} { return c.s.done }

// Close closes the client connection with a connection error, as RabbitMQ
// does: connection.close with the code to the client, then the socket.
func (c *Conn) Close(code uint16, text string) {
	c.s.closeConn(&wire.Error{Code: code, Text: text})
}

// Call is a client method chosen by ConnHooks.Methods.
type Call struct {
	// Channel is the channel the method came on.
	Channel *Channel
	// Method is the decoded method; Relay may send a modified copy.
	Method wire.Method

	payload []byte // the method frame's payload as the client sent it
	decided bool
}

// Relay sends the method upstream: m, or the client's original bytes when m
// is nil. When the method is a synchronous request that RabbitMQ will
// answer (no-wait clear) and onReply is not nil, onReply receives the
// answer before the client does; replies on a channel reach the client in
// the order of its requests whatever onReply does.
func (c *Call) Relay(m wire.Method, onReply func(*Reply)) {
	if c.decided {
		return
	}
	c.decided = true
	c.Channel.s.relayCall(c, m, onReply)
}

// Answer answers the client with m; nothing goes upstream.
func (c *Call) Answer(m wire.Method) {
	if c.decided {
		return
	}
	c.decided = true
	c.Channel.s.answerCall(c, m)
}

// CloseChannel closes the channel with a channel error (see
// Channel.CloseChannel); the method does not go upstream.
func (c *Call) CloseChannel(code uint16, text string) {
	if c.decided {
		return
	}
	c.decided = true
	c.Channel.closeByProxy(&wire.Error{Code: code, Text: text, ClassID: c.Method.ID().Class(), MethodID: c.Method.ID().Method()})
}

// Reply is RabbitMQ's answer to a relayed call, held for its hook. Exactly
// one of Pass, Send, Drop or CloseChannel must be called, from any
// goroutine; later answers on the channel wait until then.
type Reply struct {
	Channel *Channel
	// Request is the method that was relayed.
	Request wire.Method
	// Method is RabbitMQ's answer; nil when Err is set.
	Method wire.Method
	// Err is set when the channel or connection closed before an answer
	// came (then the calls below do nothing).
	Err error

	p    *pending
	once atomic.Bool
}

// Pass sends RabbitMQ's answer on to the client unchanged.
func (r *Reply) Pass() { r.resolve(replyPass, nil, nil) }

// Send sends m to the client instead of RabbitMQ's answer.
func (r *Reply) Send(m wire.Method) { r.resolve(replySend, m, nil) }

// Drop sends the client nothing (for a request the proxy made synchronous
// although the client sent it with no-wait).
func (r *Reply) Drop() { r.resolve(replyDrop, nil, nil) }

// CloseChannel closes the channel with a channel error instead of
// answering (see Channel.CloseChannel).
func (r *Reply) CloseChannel(code uint16, text string) {
	e := &wire.Error{Code: code, Text: text}
	if r.Request != nil {
		e.ClassID, e.MethodID = r.Request.ID().Class(), r.Request.ID().Method()
	}
	r.resolve(replyClose, nil, e)
}

func (r *Reply) resolve(how replyHow, m wire.Method, e *wire.Error) {
	if r.p == nil || !r.once.CompareAndSwap(false, true) {
		return
	}
	r.Channel.resolveReply(r.p, how, m, e)
}

// Message is an assembled basic.publish.
type Message struct {
	Publish wire.BasicPublish
	// Header is the content header payload: class, weight, body size,
	// property flags and property list, byte for byte as the client sent it.
	Header []byte
	Body   []byte
}

// Properties returns the property flags and list of the content header.
func (m *Message) Properties() []byte {
	if len(m.Header) < 12 {
		return nil
	}
	return m.Header[12:]
}

// Publish is a client publish handed to ConnHooks.Publish.
type Publish struct {
	Message
	Channel *Channel
	// Tag is the client's delivery tag for this publish in confirm mode,
	// 0 otherwise.
	Tag uint64
	// Claim is what InterceptsPublish returned for this publish.
	Claim any
	// Received is when the message's last bytes had reached this host, by
	// the kernel's receive time of the client socket's read that brought
	// them or a later one; the zero time where the kernel does not say.
	// On the wall clock; a busy reader takes them up later.
	Received time.Time

	methodPayload []byte
	inHook        bool
	relayed       bool
	done          atomic.Bool
}

// Relay sends the message upstream as the client sent it (the body
// re-split to the upstream frame_max). It may only be called from inside
// ConnHooks.Publish, so that the channel's publishes keep their order.
func (p *Publish) Relay() {
	if !p.inHook || p.relayed || !p.done.CompareAndSwap(false, true) {
		panic("amqpproxy: Publish.Relay called outside ConnHooks.Publish or after the publish was answered")
	}
	p.relayed = true
	p.Channel.s.relayPublish(p)
	p.Channel.s.publishAnswered(p.Channel)
}

// Ack confirms the publish to the client (basic.ack with its tag) when the
// channel is in confirm mode; otherwise it only marks the publish done.
func (p *Publish) Ack() { p.finish(false) }

// Nack refuses the publish (basic.nack with its tag) when the channel is
// in confirm mode; otherwise it only marks the publish done.
func (p *Publish) Nack() { p.finish(true) }

// CloseChannel closes the channel with a channel error (see
// Channel.CloseChannel) instead of confirming.
func (p *Publish) CloseChannel(code uint16, text string) {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	p.Channel.closeByProxy(&wire.Error{Code: code, Text: text, ClassID: 60, MethodID: 40})
	p.Channel.s.publishAnswered(p.Channel)
}

func (p *Publish) finish(nack bool) {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	if p.Tag != 0 {
		p.Channel.s.cw.q.pushNow(outItem{kind: itemLocalConfirm, ch: p.Channel, tag: p.Tag, nack: nack})
	}
	p.Channel.s.publishAnswered(p.Channel)
}
