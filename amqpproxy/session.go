package amqpproxy

import (
	"context"
	"errors"
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
	recv               recvTimer  // the client socket's receive times; nil: unknown
	cr, ur             *wire.Reader
	cw, uw             *writer

	hooks       ConnHooks
	hookMethods map[wire.MethodID]bool

	chans       chanTable
	open        atomic.Int32 // client channels open
	upMaxBody   int          // largest body frame payload upstream accepts
	downMaxBody int          // largest body frame payload the client accepts
	login       login        // the client's start-ok, for the probe connection

	state atomic.Uint32 // connRunning...; written under mu

	mu       sync.Mutex // guards the fields below
	hopDone  [2]bool    // connProxyClosing: the hop of each side is done (closed or answered)
	reason   error      // why the session ended, first one wins
	aborted  bool       // Server.Close: conns are closed, dial nothing more
	openSent bool       // the handshake is sending (or sent) connection.open-ok
	// lingering: the client is sent connection.close-ok; its socket stays
	// open, read and dropped, until it hangs up (see linger).
	lingering bool

	// handshook is closed when the handshake returned; after it, cw and uw
	// are set if the handshake succeeded.
	handshook chan struct{}

	done     chan struct{} // closed by stop
	stopOnce sync.Once
	wg       sync.WaitGroup // the writers and the upstream reader

	// ctx is canceled by stop, abort and the end of the handler: it ends
	// the probe connection's dial and probe in progress.
	ctx    context.Context
	cancel context.CancelFunc

	cArena, uArena arena // frame copies made by each reader

	// Graceful shutdown (see shutdown): once draining is set, the client
	// reader takes no new method from the client; busy is set while it
	// handles a frame; hookPending counts publishes handed to the hooks and
	// not yet answered; drainSig (capacity 1) wakes shutdown to look again.
	draining    atomic.Bool
	busy        atomic.Bool
	hookPending atomic.Int64
	drainSig    chan struct{}

	probe prober // publish permission probes, on a connection of their own
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
	s.probe.close(s.srv.cfg.CloseTimeout)
	s.linger()
}

// answeredClientClose records that connection.close-ok to the client's
// connection.close is queued: the session will linger.
func (s *session) answeredClientClose() {
	s.mu.Lock()
	s.lingering = true
	s.mu.Unlock()
}

// keepClientOpen is the client writer's keepOpen: once close-ok to the
// client's connection.close is written, the socket stays open for the
// close timeout, as RabbitMQ keeps it (rabbit_reader's closed state: it
// reads and drops until the client hangs up or its timer fires). Closing
// at once would race the client's own shutdown (amqp091-go reports 501
// "EOF") and reset a socket holding bytes the client sent after its close.
func (s *session) keepClientOpen() bool {
	s.mu.Lock()
	l := s.lingering
	s.mu.Unlock()
	if l {
		s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
	}
	return l
}

// linger reads and drops the client's bytes, when the session lingers,
// until the client hangs up or the deadline keepClientOpen set passes.
func (s *session) linger() {
	s.mu.Lock()
	l := s.lingering
	s.mu.Unlock()
	if !l {
		return
	}
	buf := make([]byte, 4<<10)
	for {
		if _, err := s.cr.Buffered().Read(buf); err != nil {
			return
		}
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
		s.cancel()
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
	s.cancel()
	s.clientConn.Close()
	if up != nil {
		up.Close()
	}
	s.probe.abort()
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

// publishAnswered records that a publish handed to the hooks on ch was
// answered; the last answer on ch applies the client's channel.close
// held until then (clientChannelClose). Any goroutine.
func (s *session) publishAnswered(ch *Channel) {
	ch.mu.Lock()
	ch.taken--
	var held []byte
	if ch.taken == 0 {
		held, ch.heldClose = ch.heldClose, nil
	}
	ch.mu.Unlock()
	if held != nil {
		s.applyClientClose(ch, func() bool { return s.uw.q.pushNow(outItem{kind: itemRelay, ch: ch, buf: held}) })
	}
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
	upOK := s.hopDone[upstreamSide]
	s.mu.Unlock()
	s.log.Warn("closing connection", "code", e.Code, "reason", e.Text)
	s.sendTo(clientSide, connCloseFrame(e))
	deadline := time.Now().Add(s.srv.cfg.CloseTimeout)
	s.client.setDeadlineBefore(deadline)
	if !upOK {
		s.sendTo(upstreamSide, methodFrame(nil, 0, &wire.ConnectionClose{
			ReplyCode: wire.ReplySuccess, ReplyText: "delayproxy: client connection closed (" + e.Error() + ")"}))
		s.upstream.setDeadlineBefore(deadline)
	}
}

// closeOK records a close-ok (or the end) of one hop in connProxyClosing,
// and stops the session when both hops are done.
func (s *session) closeOK(d side) {
	s.mu.Lock()
	s.hopDone[d] = true
	both := s.hopDone[clientSide] && s.hopDone[upstreamSide]
	s.mu.Unlock()
	if both {
		s.stop(s.endReason())
	}
}
