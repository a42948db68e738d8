package amqpproxy

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// Channel states. Transitions go through Channel.mu.
const (
	chOpen uint32 = iota
	// chClientClosing: the client sent channel.close, relayed; waiting for
	// RabbitMQ's close-ok.
	chClientClosing
	// chServerClosing: RabbitMQ sent channel.close, relayed; waiting for
	// the client's close-ok.
	chServerClosing
	// chProxyClosing: the proxy sent channel.close upstream; waiting for
	// RabbitMQ's close-ok before it tells the client.
	chProxyClosing
	// chProxyClosingClient: the proxy sent channel.close to the client;
	// waiting for its close-ok.
	chProxyClosingClient
	// chClosed: the channel number is free again.
	chClosed
)

// Channel is one client channel, open on both hops under the same number.
type Channel struct {
	id uint16
	s  *session

	state atomic.Uint32 // chOpen...; written under mu

	mu sync.Mutex // guards the fields below up to the next comment
	// confirms is non-nil once confirm.select went upstream.
	confirms *confirms
	tx       bool
	// clientClosed: in chProxyClosing, the client sent its own close.
	clientClosed bool
	closeErr     *wire.Error // why the proxy closes the channel
	replies      deque[*pending]
	// taken counts the publishes handed to ConnHooks.Publish and not yet
	// answered; while it is above 0 the client's channel.close waits in
	// heldClose (see clientChannelClose).
	taken     int
	heldClose []byte

	// acks follows deliveries and their settlements, for folding acks.
	acks ackFloor
	// in is the client publish in progress; client reader only.
	in contentIn
	// up is the upstream content in progress; upstream reader only.
	up contentIn
	// toClient and toUpstream belong to the writer of each hop.
	toClient, toUpstream outState
}

// ID is the channel number.
func (ch *Channel) ID() uint16 { return ch.id }

// Conn is the channel's connection.
func (ch *Channel) Conn() *Conn { return ch.s.info }

// ConfirmMode reports whether the client sent confirm.select.
func (ch *Channel) ConfirmMode() bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.confirms != nil
}

// TxMode reports whether the client sent tx.select.
func (ch *Channel) TxMode() bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.tx
}

// CloseChannel closes the channel with a channel error (for example 406
// PRECONDITION_FAILED), as RabbitMQ would: the proxy closes the channel
// upstream, then sends the client channel.close with code and text and
// waits for its close-ok; frames the client sends on the channel meanwhile
// are dropped, and pending confirms and replies are never sent. It reports
// false when the channel was already closing. Safe from any goroutine.
func (ch *Channel) CloseChannel(code uint16, text string) bool {
	return ch.closeByProxy(&wire.Error{Code: code, Text: text})
}

// confirmsOwed reports whether ch is open in confirm mode with client tags
// not yet confirmed to the client.
func (ch *Channel) confirmsOwed() bool {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.state.Load() == chOpen && ch.confirms != nil && ch.confirms.done.len() > 0
}

// contentIn tracks a content (header and body frames) arriving on a channel.
type contentIn struct {
	phase     uint8  // inNone, inHeader, inBody
	remaining uint64 // body bytes still to come
	relay     bool   // frames are relayed; otherwise assembled (pub) or dropped
	pub       *Publish
	body      []byte // assembled body so far
	// held is the method frame of a publish not taken at basic.publish,
	// kept until its content header says whether ConnHooks.InterceptsContent
	// takes it (heldContent); heldPub is that method, decoded.
	held    []byte
	heldPub wire.BasicPublish
}

const (
	inNone uint8 = iota
	inHeader
	inBody
)

// pending is a synchronous client request relayed upstream, waiting for
// its answer, or an answer waiting for its turn to go to the client.
type pending struct {
	request wire.Method // nil when the hook did not decode it
	onReply func(*Reply)
	state   uint8  // pendWaiting, pendHeld, pendReady, pendDone
	frame   []byte // pendReady: the frame to send the client
}

const (
	pendWaiting uint8 = iota // upstream has not answered
	pendHeld                 // the reply hook has the answer
	pendReady                // frame is to be sent when it reaches the front
	pendDone                 // nothing to send
)

type replyHow uint8

const (
	replyPass replyHow = iota
	replySend
	replyDrop
	replyClose
)

// errChannelClosed is a Reply.Err: the channel closed before RabbitMQ answered.
var errChannelClosed = errors.New("amqpproxy: channel closed before the reply")

// closeByProxy starts the proxy's own close of ch (see CloseChannel).
func (ch *Channel) closeByProxy(e *wire.Error) bool {
	ch.mu.Lock()
	if ch.state.Load() != chOpen {
		ch.mu.Unlock()
		return false
	}
	ch.state.Store(chProxyClosing)
	ch.closeErr = e
	waiting := ch.takeWaitingLocked()
	ch.mu.Unlock()
	ch.failReplies(waiting, e)
	ch.s.poke()
	ch.s.log.Info("closing channel", "channel", ch.id, "code", e.Code, "reason", e.Text)
	ch.s.uw.q.pushNow(outItem{kind: itemLifecycle, ch: ch,
		buf: methodFrame(nil, ch.id, &wire.ChannelClose{ReplyCode: wire.ReplySuccess, ReplyText: "delayproxy: " + e.Text, ClassID: e.ClassID, MethodID: e.MethodID})})
	return true
}

// takeWaitingLocked removes every pending request and returns those whose
// hooks still expect an answer. ch.mu must be held.
func (ch *Channel) takeWaitingLocked() []*pending {
	var waiting []*pending
	for ch.replies.len() > 0 {
		p := ch.replies.popFront()
		if p.state == pendWaiting && p.onReply != nil {
			waiting = append(waiting, p)
		}
	}
	return waiting
}

// failReplies tells reply hooks that no answer will come.
func (ch *Channel) failReplies(waiting []*pending, err error) {
	if len(waiting) == 0 {
		return
	}
	if err == nil {
		err = errChannelClosed
	}
	// A hook may wait for what a reader relayed before.
	ch.s.uw.q.wake()
	ch.s.cw.q.wake()
	for _, p := range waiting {
		p.onReply(&Reply{Channel: ch, Request: p.request, Err: err})
	}
}

// resolveReply applies a reply hook's decision.
func (ch *Channel) resolveReply(p *pending, how replyHow, m wire.Method, e *wire.Error) {
	if how == replyClose {
		ch.mu.Lock()
		p.state = pendDone
		ch.flushRepliesLocked()
		ch.mu.Unlock()
		ch.closeByProxy(e)
		return
	}
	ch.mu.Lock()
	switch how {
	case replyPass: // p.frame already holds the upstream frame
		p.state = pendReady
	case replySend:
		p.frame = methodFrame(nil, ch.id, m)
		p.state = pendReady
	case replyDrop:
		p.state = pendDone
	}
	ch.flushRepliesLocked()
	ch.mu.Unlock()
}

// flushRepliesLocked sends the answers at the front of the queue that are
// ready, in order. ch.mu must be held.
func (ch *Channel) flushRepliesLocked() {
	for ch.replies.len() > 0 {
		p := *ch.replies.at(0)
		switch p.state {
		case pendReady:
			if ch.state.Load() == chOpen {
				ch.s.cw.q.pushNow(outItem{kind: itemReply, ch: ch, buf: p.frame})
			}
		case pendDone:
		default:
			return
		}
		ch.replies.popFront()
	}
}

// chanTable maps channel numbers to channels without locks on lookup: 256
// blocks of 256 slots, a block allocated when first used.
type chanTable struct {
	blocks [256]atomic.Pointer[[256]atomic.Pointer[Channel]]
}

func (t *chanTable) get(id uint16) *Channel {
	b := t.blocks[id>>8].Load()
	if b == nil {
		return nil
	}
	return b[id&0xff].Load()
}

// set stores ch under id; only the client reader adds channels, so blocks
// are created by one goroutine.
func (t *chanTable) set(id uint16, ch *Channel) {
	b := t.blocks[id>>8].Load()
	if b == nil {
		b = new([256]atomic.Pointer[Channel])
		t.blocks[id>>8].Store(b)
	}
	b[id&0xff].Store(ch)
}

// remove clears id if it still holds ch.
func (t *chanTable) remove(id uint16, ch *Channel) bool {
	b := t.blocks[id>>8].Load()
	return b != nil && b[id&0xff].CompareAndSwap(ch, nil)
}

// each calls f for every channel in the table.
func (t *chanTable) each(f func(*Channel)) {
	for i := range t.blocks {
		b := t.blocks[i].Load()
		if b == nil {
			continue
		}
		for j := range b {
			if ch := b[j].Load(); ch != nil {
				f(ch)
			}
		}
	}
}

// methodFrame appends a method frame carrying m on channel ch to dst.
func methodFrame(dst []byte, ch uint16, m wire.Method) []byte {
	start := len(dst)
	dst = append(dst, wire.FrameMethod, byte(ch>>8), byte(ch), 0, 0, 0, 0)
	dst = wire.AppendMethod(dst, m)
	n := len(dst) - start - wire.FrameHeaderSize
	dst[start+3], dst[start+4], dst[start+5], dst[start+6] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return append(dst, wire.FrameEnd)
}

// freeChannel makes a closed channel's number free; pending replies fail.
func (s *session) freeChannel(ch *Channel) {
	ch.mu.Lock()
	if ch.state.Load() == chClosed {
		ch.mu.Unlock()
		return
	}
	ch.state.Store(chClosed)
	waiting := ch.takeWaitingLocked()
	ch.mu.Unlock()
	ch.failReplies(waiting, nil)
	if s.chans.remove(ch.id, ch) {
		s.open.Add(-1)
		s.srv.cfg.Metrics.ChannelsOpened(-1)
	}
	s.poke()
}
