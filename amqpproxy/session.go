package amqpproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// Connection states. Transitions go through session.mu.
const (
	connRunning uint32 = iota
	// connClientClosing: the client sent connection.close, relayed.
	connClientClosing
	// connUpstreamClosing: RabbitMQ sent connection.close, relayed.
	connUpstreamClosing
	// connProxyClosing: the proxy closes the connection; it waits for the
	// close-ok of each hop still up, dropping every other frame.
	connProxyClosing
)

// session is one client connection and its upstream connection.
//
// Goroutines: the handler (Server.handle) runs the handshake and then the
// client reader; it starts the upstream reader and one writer per socket,
// and returns only after all three have exited. Readers relay frames into
// the other hop's writer queue; writers own their socket's write side and
// close the socket when they exit, which ends the reader of that socket.
type session struct {
	srv    *Server
	log    *slog.Logger
	info   *Conn
	opened time.Time // when the handshake completed

	clientConn, upConn net.Conn   // as read and written (TLS or TCP)
	client, upstream   *readTimer // read side, with heartbeat deadlines
	cr, ur             *wire.Reader
	cw, uw             *writer

	hooks       ConnHooks
	hookMethods map[wire.MethodID]bool

	chans       chanTable
	open        atomic.Int32 // client channels open (channel_max counts these)
	channelMax  uint16       // negotiated with the client; 0: none
	reserved    uint16       // upstream channel kept for the proxy; 0: none
	upMaxBody   int          // largest body frame payload upstream accepts
	downMaxBody int          // largest body frame payload the client accepts

	state atomic.Uint32 // connRunning...; written under mu

	mu         sync.Mutex // guards the fields below
	clientOK   bool       // connProxyClosing: the client hop is done
	upstreamOK bool       // connProxyClosing: the upstream hop is done
	reason     error      // why the session ended, first one wins
	aborted    bool       // Server.Close: conns are closed, dial nothing more
	openSent   bool       // the handshake is sending (or sent) connection.open-ok

	// handshook is closed when the handshake returned; after it, cw and uw
	// are set if the handshake succeeded.
	handshook chan struct{}

	done     chan struct{} // closed by stop
	stopOnce sync.Once
	wg       sync.WaitGroup // the writers and the upstream reader

	cArena, uArena arena // frame copies made by each reader

	// Graceful shutdown (see shutdown): once draining is set, the client
	// reader takes no new method from the client; busy is set while it
	// handles a frame; hookPending counts publishes handed to the hooks and
	// not yet answered; drainSig (capacity 1) wakes shutdown to look again.
	draining    atomic.Bool
	busy        atomic.Bool
	hookPending atomic.Int64
	drainSig    chan struct{}

	probe probeSlot // publish permission probes on the reserved channel
}

// Errors that end sessions, logged and passed to ConnHooks.Closed.
var (
	errClientClosed   = errors.New("client closed the connection")
	errUpstreamClosed = errors.New("upstream closed the connection")
	errServerClosed   = errors.New("server closed")
)

// run starts the relay after a successful handshake and returns when the
// session is over.
func (s *session) run() {
	s.mu.Lock()
	aborted := s.aborted
	s.mu.Unlock()
	if aborted {
		return
	}
	m := s.srv.cfg.Metrics
	m.ConnOpened()
	defer func() {
		m.ChannelsOpened(-int(s.open.Load())) // channels that were open when it ended
		m.ConnClosed()
	}()
	if ic := s.srv.cfg.Interceptor; ic != nil {
		if h := ic.Open(s.info); h != nil {
			s.hooks = h
			s.hookMethods = map[wire.MethodID]bool{}
			for _, id := range h.Methods() {
				switch id {
				case wire.IDChannelOpen, wire.IDChannelClose, wire.IDChannelCloseOk, wire.IDBasicPublish,
					wire.IDConfirmSelect, wire.IDTxSelect:
				default:
					if id.Class() != 10 {
						s.hookMethods[id] = true
					}
				}
			}
		}
	}
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.cw.run() }()
	go func() { defer s.wg.Done(); s.uw.run() }()
	go func() { defer s.wg.Done(); s.upstreamLoop() }()
	s.clientLoop()
	s.stop(nil)
	s.wg.Wait()
	s.chans.each(func(ch *Channel) {
		ch.mu.Lock()
		waiting := ch.takeWaitingLocked()
		ch.mu.Unlock()
		ch.failReplies(waiting, errConnClosed)
	})
	if s.hooks != nil {
		s.hooks.Closed(s.endReason())
	}
}

var errConnClosed = errors.New("amqpproxy: connection closed before the reply")

func (s *session) endReason() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}

// stop ends the session: both writers write what is queued (within the
// drain timeout), then close their sockets.
func (s *session) stop(reason error) {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		if s.reason == nil {
			s.reason = reason
		}
		s.mu.Unlock()
		close(s.done)
		deadline := time.Now().Add(s.srv.cfg.CloseTimeout)
		if s.cw != nil {
			s.clientConn.SetWriteDeadline(deadline)
			s.cw.q.close()
		}
		if s.uw != nil {
			s.upConn.SetWriteDeadline(deadline)
			s.uw.q.close()
		}
	})
}

// abort closes both sockets at once (Server.Close).
func (s *session) abort() {
	s.mu.Lock()
	s.aborted = true
	if s.reason == nil {
		s.reason = errServerClosed
	}
	up := s.upConn
	s.mu.Unlock()
	s.clientConn.Close()
	if up != nil {
		up.Close()
	}
}

// shutdown closes the connection as RabbitMQ does when it stops (320
// CONNECTION_FORCED) without losing a confirm the client is owed: it stops
// taking methods from the client (frames that complete a content already
// begun still go through), waits until every publish handed to the hooks is
// answered and every confirm owed on an open channel is written, then sends
// connection.close. ctx bounds the wait; the close goes out when it ends
// either way. A connection still in its handshake is closed at once, as
// RabbitMQ does; one whose connection.open-ok is on its way gets the close
// after it (queued now, written once the writers run).
func (s *session) shutdown(ctx context.Context) {
	s.mu.Lock()
	openSent := s.openSent
	s.mu.Unlock()
	if !openSent {
		s.abort()
		return
	}
	select {
	case <-s.handshook:
	case <-ctx.Done():
		s.abort()
		return
	}
	if s.cw == nil {
		return // the handshake failed after all: its handler hangs up
	}
	s.draining.Store(true)
wait:
	for !s.drained() {
		select {
		case <-s.drainSig:
		case <-ctx.Done():
			s.log.Warn("shutting down with confirms or publishes still pending", "err", ctx.Err())
			break wait
		case <-s.done:
			return
		}
	}
	if s.state.Load() == connRunning {
		s.closeConn(&wire.Error{Code: wire.ConnectionForced, Text: "delayproxy is shutting down"})
	}
}

// drained reports whether the client reader is between frames and nothing
// the client is owed is pending: no publish with the hooks, no confirm on
// an open channel. Once draining is set and drained reports true, it stays
// true: the client reader starts nothing new.
func (s *session) drained() bool {
	if s.busy.Load() || s.hookPending.Load() > 0 {
		return false
	}
	idle := true
	s.chans.each(func(ch *Channel) {
		if idle && ch.confirmsOwed() {
			idle = false
		}
	})
	return idle
}

// poke wakes a shutdown waiting for the session to drain. A nil session
// (a writer's unit test) does nothing.
func (s *session) poke() {
	if s != nil && s.draining.Load() {
		select {
		case s.drainSig <- struct{}{}:
		default:
		}
	}
}

// publishAnswered records that a publish handed to the hooks was answered.
func (s *session) publishAnswered() {
	s.hookPending.Add(-1)
	s.poke()
}

func (s *session) stopped() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

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

// upstreamLoop is the upstream reader.
func (s *session) upstreamLoop() {
	for {
		f, err := s.ur.ReadFrame()
		if err != nil {
			s.upstreamReadFailed(err)
			return
		}
		if !s.fromUpstream(f) {
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
	s.upstreamOK = true
	clientOK := s.clientOK
	s.mu.Unlock()
	s.uw.q.close()
	switch prev {
	case connRunning:
		reason := "upstream connection lost"
		if isTimeout(err) {
			reason = "upstream missed heartbeats"
		}
		s.log.Warn(reason+", closing the client connection", "upstream", s.srv.up.hostport, "err", err)
		s.sendClient(connCloseFrame(&wire.Error{Code: wire.ConnectionForced, Text: "delayproxy: " + reason}))
		s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
	case connClientClosing:
		s.sendClient(methodFrame(nil, 0, &wire.ConnectionCloseOk{}))
		s.stop(errClientClosed)
	case connUpstreamClosing:
		s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
	case connProxyClosing:
		if clientOK {
			s.stop(s.endReason())
		}
	}
}

// closeConn closes the connection with a connection error made by the
// proxy: connection.close to the client (code and text as RabbitMQ words
// them) and to RabbitMQ, then the sockets once both answered or the close
// timeout passed.
func (s *session) closeConn(e *wire.Error) {
	s.mu.Lock()
	if s.state.Load() == connProxyClosing {
		s.mu.Unlock()
		return
	}
	s.state.Store(connProxyClosing)
	if s.reason == nil {
		s.reason = e
	}
	upOK := s.upstreamOK
	s.mu.Unlock()
	s.log.Warn("closing connection", "code", e.Code, "reason", e.Text)
	s.sendClient(connCloseFrame(e))
	deadline := time.Now().Add(s.srv.cfg.CloseTimeout)
	s.client.setDeadlineBefore(deadline)
	if !upOK {
		s.uw.q.pushNow(outItem{kind: itemLifecycle, buf: methodFrame(nil, 0, &wire.ConnectionClose{
			ReplyCode: wire.ReplySuccess, ReplyText: "delayproxy: client connection closed (" + e.Error() + ")"})})
		s.upstream.setDeadlineBefore(deadline)
	}
}

// closeOK records a close-ok (or the end) of one hop in connProxyClosing,
// and stops the session when both hops are done.
func (s *session) closeOK(client bool) {
	s.mu.Lock()
	if client {
		s.clientOK = true
	} else {
		s.upstreamOK = true
	}
	both := s.clientOK && s.upstreamOK
	s.mu.Unlock()
	if both {
		s.stop(s.endReason())
	}
}

func connCloseFrame(e *wire.Error) []byte {
	return methodFrame(nil, 0, &wire.ConnectionClose{ReplyCode: e.Code, ReplyText: replyText(e), ClassID: e.ClassID, MethodID: e.MethodID})
}

// replyText words a reply as RabbitMQ does: "NOT_FOUND - no queue 'x'"
// (the codec cuts it to 255 bytes on a rune boundary).
func replyText(e *wire.Error) string {
	return wire.ReplyText(e.Code) + " - " + e.Text
}

// sendClient queues a frame made by the proxy for the client.
func (s *session) sendClient(frame []byte) {
	s.cw.q.pushNow(outItem{kind: itemLifecycle, buf: frame})
}

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

// fromClient handles one client frame; false ends the client reader.
func (s *session) fromClient(f wire.Frame) bool {
	if f.Type == wire.FrameHeartbeat && f.Channel == 0 {
		return true
	}
	if s.state.Load() == connProxyClosing {
		return s.clientWhileClosing(f)
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
		return s.clientConnFrame(f)
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

// openChannel handles channel.open for a free channel number.
func (s *session) openChannel(f wire.Frame) bool {
	id := f.Channel
	if s.reserved != 0 && id == s.reserved {
		s.closeConn(&wire.Error{Code: wire.NotAllowed, ClassID: 20, MethodID: 10,
			Text: fmt.Sprintf("channel %d exceeds the negotiated channel_max (%d)", id, s.channelMax)})
		return true
	}
	if n := s.open.Load(); s.channelMax != 0 && n >= int32(s.channelMax) {
		s.closeConn(&wire.Error{Code: wire.NotAllowed,
			Text: fmt.Sprintf("number of channels opened (%d) has reached the negotiated channel_max (%d)", n, s.channelMax)})
		return true
	}
	ch := &Channel{id: id, s: s}
	s.chans.set(id, ch)
	s.open.Add(1)
	s.srv.cfg.Metrics.ChannelsOpened(1)
	return s.relayUp(f, ch)
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
		ch.mu.Lock()
		if ch.state.Load() != chOpen { // the proxy began closing it meanwhile
			ch.mu.Unlock()
			s.clientMethodProxyClosing(ch, id)
			return true
		}
		ch.state.Store(chClientClosing)
		waiting := ch.takeWaitingLocked()
		ch.mu.Unlock()
		ch.failReplies(waiting, nil)
		return s.relayUp(f, ch)
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
	}
	if s.hooks != nil {
		return s.clientMethodHooked(ch, id, f)
	}
	return s.relayUp(f, ch)
}

// clientMethodProxyClosing: the proxy is closing ch; the client's frames are
// dropped except its close and close-ok.
func (s *session) clientMethodProxyClosing(ch *Channel, id wire.MethodID) {
	switch id {
	case wire.IDChannelClose:
		ch.mu.Lock()
		switch ch.state.Load() {
		case chProxyClosing:
			ch.clientClosed = true
		case chProxyClosingClient: // crossing closes: answer it, still wait for ours
			s.cw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelCloseOk{})})
		}
		ch.mu.Unlock()
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
		if err := m.Decode(f.Payload[4:]); err == nil && s.hooks.InterceptsPublish(ch, &m) {
			ch.in = contentIn{phase: inHeader, pub: &Publish{Channel: ch, Message: Message{Publish: m},
				methodPayload: append([]byte(nil), f.Payload...)}}
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
	ch.mu.Unlock()
	p.inHook = true
	s.hookPending.Add(1)
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
	s.splitBody(q, &s.cArena, wire.Frame{Type: wire.FrameBody, Channel: ch.id, Payload: p.Body}, ch, s.upMaxBody)
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

// fromUpstream handles one upstream frame; false ends the upstream reader.
func (s *session) fromUpstream(f wire.Frame) bool {
	if f.Type == wire.FrameHeartbeat {
		return true
	}
	if s.state.Load() == connProxyClosing {
		return s.upstreamWhileClosing(f)
	}
	if f.Channel == 0 {
		return s.upstreamConnFrame(f)
	}
	if f.Channel == s.reserved {
		s.reservedFrame(f) // the proxy's own: never relayed
		return true
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

// proxyCloseUpstreamDone: RabbitMQ answered the proxy's channel.close; now
// the client is told (or, if it closed the channel itself meanwhile,
// answered).
func (s *session) proxyCloseUpstreamDone(ch *Channel) {
	ch.mu.Lock()
	if ch.clientClosed {
		ch.mu.Unlock()
		s.freeChannel(ch)
		s.cw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelCloseOk{})})
		return
	}
	ch.state.Store(chProxyClosingClient)
	e := ch.closeErr
	s.cw.q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, ch.id, &wire.ChannelClose{
		ReplyCode: e.Code, ReplyText: replyText(e), ClassID: e.ClassID, MethodID: e.MethodID})})
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
	p.onReply(r)
	return true
}

// payloadNoWait reports whether a method frame payload has its no-wait bit
// set (false for methods without one).
func payloadNoWait(id wire.MethodID, payload []byte) bool {
	switch id {
	case wire.IDExchangeDeclare, wire.IDExchangeDelete, wire.IDExchangeBind, wire.IDExchangeUnbind,
		wire.IDQueueDeclare, wire.IDQueueBind, wire.IDQueuePurge, wire.IDQueueDelete,
		wire.IDBasicConsume, wire.IDBasicCancel, wire.IDConfirmSelect:
		m, err := wire.DecodeMethod(payload)
		return err == nil && methodNoWait(m)
	}
	return false
}

func methodNoWait(m wire.Method) bool {
	switch m := m.(type) {
	case *wire.ExchangeDeclare:
		return m.NoWait
	case *wire.ExchangeDelete:
		return m.NoWait
	case *wire.ExchangeBind:
		return m.NoWait
	case *wire.ExchangeUnbind:
		return m.NoWait
	case *wire.QueueDeclare:
		return m.NoWait
	case *wire.QueueBind:
		return m.NoWait
	case *wire.QueuePurge:
		return m.NoWait
	case *wire.QueueDelete:
		return m.NoWait
	case *wire.BasicConsume:
		return m.NoWait
	case *wire.BasicCancel:
		return m.NoWait
	case *wire.ConfirmSelect:
		return m.NoWait
	}
	return false
}

// unexpectedFrame is RabbitMQ's 505 for a frame that breaks a content.
func unexpectedFrame(phase uint8, f wire.Frame, classID, methodID uint16) *wire.Error {
	text := "expected content body, got non content body frame instead"
	if phase == inHeader {
		text = "expected content header for class 60, got non content header frame instead"
	}
	return &wire.Error{Code: wire.UnexpectedFrame, Text: text, ClassID: classID, MethodID: methodID}
}

// erlBinary prints bytes as Erlang does in RabbitMQ's error texts.
func erlBinary(b []byte) string {
	if len(b) > 16 {
		b = b[:16]
	}
	out := []byte("<<")
	for i, c := range b {
		if i > 0 {
			out = append(out, ',')
		}
		out = fmt.Appendf(out, "%d", c)
	}
	return string(append(out, ">>"...))
}

// arena hands out frame copies carved from 16 KiB chunks, so relaying a
// small frame costs no allocation of its own. A chunk is freed by the GC
// once every frame in it has been written and the arena moved on. Frames
// larger than a quarter chunk get their own allocation. Only the reader
// that owns the arena carves from it; trim (any goroutine) makes it start a
// new chunk next time, so an idle connection holds none.
type arena struct{ cur atomic.Pointer[arenaBuf] }

// arenaBuf is one chunk; only the owning reader touches buf.
type arenaBuf struct{ buf []byte }

const arenaChunk = 16 << 10

func (a *arena) frame(typ uint8, ch uint16, payload []byte) []byte {
	n := len(payload) + wire.FrameOverhead
	if n > arenaChunk/4 {
		return wire.AppendFrame(make([]byte, 0, n), wire.Frame{Type: typ, Channel: ch, Payload: payload})
	}
	c := a.cur.Load()
	if c == nil || cap(c.buf)-len(c.buf) < n {
		c = &arenaBuf{buf: make([]byte, 0, arenaChunk)}
		a.cur.Store(c)
	}
	start := len(c.buf)
	c.buf = wire.AppendFrame(c.buf, wire.Frame{Type: typ, Channel: ch, Payload: payload})
	return c.buf[start:len(c.buf):len(c.buf)]
}

// trim lets go of the current chunk (the frames carved from it stay valid).
func (a *arena) trim() { a.cur.Store(nil) }
