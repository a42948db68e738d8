package amqpproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// preTuneFrameMax is the largest frame RabbitMQ accepts before tune-ok.
const preTuneFrameMax = wire.FrameMinSize

// noLimitFrameMax bounds frames when both sides negotiated frame_max 0.
const noLimitFrameMax = 1 << 20

// errHandshake ends a handshake without a connection.close to the client,
// as RabbitMQ does for handshake errors other than a refused login.
var errHandshake = errors.New("handshake failed")

// handshake runs the connection handshake: on the client's protocol header
// the proxy dials RabbitMQ and greets the client with RabbitMQ's own
// connection.start (see greeting.go), logs in to RabbitMQ with the client's
// start-ok, offers the client RabbitMQ's tune values (the heartbeat of
// Config.Heartbeat), sends RabbitMQ the client's tune-ok, and relays open
// and open-ok. Both hops end up with the same channel_max, frame_max and
// heartbeat. It reports whether the relay can start; on failure the client
// has been answered as RabbitMQ would answer it, and the caller closes the
// sockets.
func (s *session) handshake(ctx context.Context) bool {
	cfg := &s.srv.cfg
	deadline := time.Now().Add(cfg.HandshakeTimeout)
	s.client.setDeadline(deadline)
	s.clientConn.SetWriteDeadline(deadline)
	cw := wire.NewWriter(s.clientConn)

	if err := wire.ReadProtocolHeader(s.cr.Buffered()); err != nil {
		if errors.Is(err, wire.ErrBadProtocolHeader) {
			cw.Write(wire.ProtocolHeader[:])
			cw.Flush()
		}
		s.log.Debug("no AMQP 0-9-1 protocol header", "err", err)
		return false
	}
	uw, upStart, upErr := s.greetUpstream(ctx, deadline)
	if err := writeMethod(cw, 0, s.srv.greeting(upStart)); err != nil {
		return false
	}

	f, err := readMethod(s.cr, wire.IDConnectionStartOk)
	if err != nil {
		s.log.Info("handshake failed", "step", "start-ok", "err", err)
		return false
	}
	startOkPayload := bytes.Clone(f.Payload)
	var startOk wire.ConnectionStartOk
	if err := startOk.Decode(f.Payload[4:]); err != nil {
		s.log.Info("handshake failed", "step", "start-ok", "err", err)
		return false
	}
	if startOk.Mechanism != "PLAIN" && startOk.Mechanism != "AMQPLAIN" {
		s.log.Info("handshake failed", "err", fmt.Sprintf("unknown authentication mechanism '%s'", startOk.Mechanism))
		return false
	}
	s.info.User = loginUser(startOk.Mechanism, startOk.Response)
	s.login = login{mechanism: startOk.Mechanism, response: bytes.Clone(startOk.Response), locale: startOk.Locale}
	s.info.ClientProperties = wire.Table(bytes.Clone(startOk.ClientProperties))
	s.log = s.log.With("user", s.info.User)
	if name, ok, _ := startOk.ClientProperties.Get("connection_name"); ok {
		if n, ok := name.(string); ok {
			s.log = s.log.With("connection_name", n)
		}
	}
	if upErr != nil {
		return s.upstreamHandshakeFailed(cw, upErr)
	}
	if err := writeFrame(uw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: startOkPayload})); err != nil {
		return s.upstreamHandshakeFailed(cw, upstreamFailed(s.srv.up.HostPort, err))
	}

	// Login: RabbitMQ may challenge (relayed), refuse, or tune.
	var tune wire.ConnectionTune
	for {
		f, err := readMethod(s.ur, 0)
		if err != nil {
			// RabbitMQ hangs up without a word on a refused login unless the
			// client announced authentication_failure_close; so do we.
			s.log.Info("upstream refused the login", "err", err)
			return false
		}
		id, _ := wire.PeekMethodID(f.Payload)
		switch id {
		case wire.IDConnectionTune:
			err = tune.Decode(f.Payload[4:])
		case wire.IDConnectionSecure:
			if err = writeFrame(cw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: f.Payload})); err == nil {
				var cf wire.Frame
				if cf, err = readMethod(s.cr, wire.IDConnectionSecureOk); err == nil {
					err = writeFrame(uw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: cf.Payload}))
				}
			}
			if err != nil {
				s.log.Info("handshake failed", "step", "secure", "err", err)
				return false
			}
			continue
		case wire.IDConnectionClose:
			s.relayHandshakeClose(cw, uw, f.Payload)
			return false
		default:
			err = fmt.Errorf("unexpected %v from upstream", id)
		}
		if err != nil {
			return s.upstreamHandshakeFailed(cw, upstreamFailed(s.srv.up.HostPort, err))
		}
		break
	}

	offer := tune
	offer.Heartbeat = 0
	if hb := cfg.Heartbeat; hb > 0 {
		offer.Heartbeat = uint16(min(hb/time.Second, math.MaxUint16))
	}
	if err := writeMethod(cw, 0, &offer); err != nil {
		return false
	}
	f, err = readMethod(s.cr, wire.IDConnectionTuneOk)
	if err != nil {
		s.log.Info("handshake failed", "step", "tune-ok", "err", err)
		return false
	}
	var tuneOk wire.ConnectionTuneOk
	if err := tuneOk.Decode(f.Payload[4:]); err != nil {
		s.log.Info("handshake failed", "step", "tune-ok", "err", err)
		return false
	}
	// RabbitMQ judges the client's tune-ok as it would judge it directly.
	if err := writeFrame(uw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: f.Payload})); err != nil {
		return s.upstreamHandshakeFailed(cw, upstreamFailed(s.srv.up.HostPort, err))
	}

	f, err = readMethod(s.cr, wire.IDConnectionOpen)
	if err != nil {
		s.log.Info("handshake failed", "step", "open", "err", err)
		return false
	}
	var open wire.ConnectionOpen
	if err := open.Decode(f.Payload[4:]); err != nil {
		s.log.Info("handshake failed", "step", "open", "err", err)
		return false
	}
	if err := writeFrame(uw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: f.Payload})); err != nil {
		return s.upstreamHandshakeFailed(cw, upstreamFailed(s.srv.up.HostPort, err))
	}
	s.info.VHost = open.VirtualHost
	s.log = s.log.With("vhost", open.VirtualHost)

	f, err = readMethod(s.ur, 0)
	if err != nil {
		// RabbitMQ may hang up (negotiation failed): so do we.
		s.log.Info("upstream refused the connection", "err", err)
		return false
	}
	switch id, _ := wire.PeekMethodID(f.Payload); id {
	case wire.IDConnectionOpenOk:
	case wire.IDConnectionClose:
		s.relayHandshakeClose(cw, uw, f.Payload)
		return false
	default:
		return s.upstreamHandshakeFailed(cw, upstreamFailed(s.srv.up.HostPort, fmt.Errorf("unexpected %v from upstream", id)))
	}
	// From here a shutdown closes the connection with 320 rather than
	// hanging up (see session.shutdown).
	s.mu.Lock()
	aborted := s.aborted
	s.openSent = true
	s.mu.Unlock()
	if aborted {
		return false
	}
	if err := writeFrame(cw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: f.Payload})); err != nil {
		return false
	}

	cw.Release() // everything is flushed: an idle connection holds no write buffer
	uw.Release()

	// Both hops are open with the same tuning.
	frameMax := tuneOk.FrameMax
	if frameMax == 0 {
		frameMax = noLimitFrameMax
	}
	s.info.ChannelMax, s.info.FrameMax, s.info.Heartbeat = tuneOk.ChannelMax, tuneOk.FrameMax, tuneOk.Heartbeat
	s.upMaxBody = int(frameMax) - wire.FrameOverhead
	s.downMaxBody = s.upMaxBody
	s.cr.SetMaxFrame(frameMax)
	s.ur.SetMaxFrame(frameMax)
	s.client.setDeadline(time.Time{})
	s.upstream.setDeadline(time.Time{})
	s.clientConn.SetWriteDeadline(time.Time{})
	s.upConn.SetWriteDeadline(time.Time{})
	var beat time.Duration
	if hb := time.Duration(tuneOk.Heartbeat) * time.Second; hb > 0 {
		s.client.idle.Store(int64(2 * hb))
		s.upstream.idle.Store(int64(2 * hb))
		beat = hb / 2
	}
	limit := cfg.WriteQueueBytes
	s.cw = &writer{conn: s.clientConn, w: cw, q: newOutQueue(limit), toClient: true, beat: beat, metrics: cfg.Metrics, arena: &s.uArena,
		fail: func(err error) { s.stop(fmt.Errorf("writing to client: %w", err)) }, keepOpen: s.keepClientOpen}
	s.uw = &writer{conn: s.upConn, w: uw, q: newOutQueue(limit), beat: beat, metrics: cfg.Metrics, arena: &s.cArena,
		fail: func(err error) { s.upstreamReadFailed(fmt.Errorf("writing upstream: %w", err)) }}
	attrs := []any{"heartbeat", int(tuneOk.Heartbeat), "frame_max", int(tuneOk.FrameMax), "channel_max", int(tuneOk.ChannelMax)}
	if v, ok, _ := s.info.ClientProperties.Get("connection_name"); ok {
		if name, ok := v.(string); ok {
			attrs = append(attrs, "connection_name", name)
		}
	}
	s.opened = time.Now()
	s.log.Info("client connection opened", attrs...)
	return true
}

// greetUpstream dials RabbitMQ (TLS for amqps://) within the handshake
// deadline, sends the protocol header and returns RabbitMQ's
// connection.start, with the writer of the upstream socket. The error
// says why RabbitMQ cannot be reached, in words for the client.
func (s *session) greetUpstream(ctx context.Context, deadline time.Time) (*wire.Writer, *wire.ConnectionStart, error) {
	hostport := s.srv.up.HostPort
	up, err := s.dialUpstream(ctx, deadline)
	if err != nil {
		return nil, nil, fmt.Errorf("RabbitMQ at %s is unreachable: %w", hostport, err)
	}
	uw := wire.NewWriter(up)
	if err := writeFrame(uw, wire.ProtocolHeader[:]); err != nil {
		return nil, nil, upstreamFailed(hostport, err)
	}
	f, err := readMethod(s.ur, wire.IDConnectionStart)
	if err != nil {
		return nil, nil, upstreamFailed(hostport, err)
	}
	var start wire.ConnectionStart
	if err := start.Decode(f.Payload[4:]); err != nil {
		return nil, nil, upstreamFailed(hostport, err)
	}
	start.ServerProperties = bytes.Clone(start.ServerProperties) // the reader's buffer moves on
	start.Mechanisms, start.Locales = bytes.Clone(start.Mechanisms), bytes.Clone(start.Locales)
	return uw, &start, nil
}

// upstreamFailed words a failed handshake with RabbitMQ for the client.
func upstreamFailed(hostport string, err error) error {
	return fmt.Errorf("handshake with RabbitMQ at %s failed: %w", hostport, err)
}

// dialUpstream connects to RabbitMQ within the handshake deadline and
// sets up the upstream read side.
func (s *session) dialUpstream(ctx context.Context, deadline time.Time) (net.Conn, error) {
	c, err := s.srv.dial(ctx, deadline)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.aborted {
		s.mu.Unlock()
		c.Close()
		return nil, errServerClosed
	}
	s.upConn = c
	s.mu.Unlock()
	c.SetWriteDeadline(deadline)
	s.upstream = &readTimer{Conn: c}
	s.upstream.setDeadline(deadline)
	s.ur = wire.NewReader(s.upstream, 128<<10)
	return c, nil
}

// dial connects to RabbitMQ (TLS for amqps://) before deadline.
func (srv *Server) dial(ctx context.Context, deadline time.Time) (net.Conn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	d := net.Dialer{Timeout: srv.cfg.DialTimeout}
	c, err := d.DialContext(ctx, "tcp", srv.up.HostPort)
	if err != nil {
		return nil, err
	}
	setNoDelay(c)
	if srv.up.TLS != nil {
		tc := tls.Client(c, srv.up.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	return c, nil
}

// upstreamHandshakeFailed tells the client, with 320 CONNECTION_FORCED,
// why RabbitMQ could not be reached or spoke out of turn.
func (s *session) upstreamHandshakeFailed(cw *wire.Writer, err error) bool {
	s.log.Warn("closing the client connection", "upstream", s.srv.up.HostPort, "err", err)
	e := &wire.Error{Code: wire.ConnectionForced, Text: "delayproxy: " + err.Error()}
	if writeFrame(cw, connCloseFrame(e)) == nil {
		s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
		awaitCloseOk(s.cr, cw)
	}
	return false
}

// relayHandshakeClose passes RabbitMQ's connection.close (403 refused
// login, 530 vhost) to the client and the client's close-ok back.
func (s *session) relayHandshakeClose(cw, uw *wire.Writer, payload []byte) {
	var cm wire.ConnectionClose
	if cm.Decode(payload[4:]) == nil {
		s.log.Info("upstream refused the connection", "code", cm.ReplyCode, "reason", cm.ReplyText)
	}
	if writeFrame(cw, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 0, Payload: payload})) != nil {
		return
	}
	s.client.setDeadlineBefore(time.Now().Add(s.srv.cfg.CloseTimeout))
	if awaitCloseOk(s.cr, cw) {
		writeMethod(uw, 0, &wire.ConnectionCloseOk{})
	}
}

// awaitCloseOk reads, after a connection.close to the client, what the
// client sends until its close-ok (reported true), dropping everything
// else but a crossing connection.close, which is answered, as RabbitMQ's
// closed state does; false when the client hangs up or the deadline set on
// its socket passes first.
func awaitCloseOk(r *wire.Reader, w *wire.Writer) bool {
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return false
		}
		if f.Type != wire.FrameMethod || f.Channel != 0 {
			continue
		}
		switch id, _ := wire.PeekMethodID(f.Payload); id {
		case wire.IDConnectionCloseOk:
			return true
		case wire.IDConnectionClose:
			writeMethod(w, 0, &wire.ConnectionCloseOk{})
		}
	}
}

// readMethod reads the next method frame on channel 0, skipping
// heartbeats; want (when not 0) is the only method accepted.
func readMethod(r *wire.Reader, want wire.MethodID) (wire.Frame, error) {
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return f, err
		}
		if f.Type == wire.FrameHeartbeat {
			continue
		}
		if f.Type != wire.FrameMethod || f.Channel != 0 {
			return f, fmt.Errorf("%w: frame type %d on channel %d", errHandshake, f.Type, f.Channel)
		}
		id, err := wire.PeekMethodID(f.Payload)
		if err != nil {
			return f, err
		}
		if want != 0 && id != want {
			return f, fmt.Errorf("%w: got %v, want %v", errHandshake, id, want)
		}
		return f, nil
	}
}

func writeMethod(w *wire.Writer, ch uint16, m wire.Method) error {
	return writeFrame(w, methodFrame(nil, ch, m))
}

func writeFrame(w *wire.Writer, frame []byte) error {
	if _, err := w.Write(frame); err != nil {
		return err
	}
	return w.Flush()
}

// loginUser extracts the user name from a PLAIN or AMQPLAIN response, for
// logs and the interceptor.
func loginUser(mechanism string, resp []byte) string {
	switch mechanism {
	case "PLAIN": // authzid NUL authcid NUL password
		parts := bytes.SplitN(resp, []byte{0}, 3)
		if len(parts) == 3 {
			return string(parts[1])
		}
	case "AMQPLAIN": // a field table without its length prefix
		if v, ok, _ := wire.Table(resp).Get("LOGIN"); ok {
			switch v := v.(type) {
			case string:
				return v
			case []byte:
				return string(v)
			}
		}
	}
	return ""
}
