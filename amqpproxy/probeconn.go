package amqpproxy

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// The probe connection (see authz.go): a connection to RabbitMQ of the
// session's own, logged in as the client. It has no heartbeats and no
// reader goroutine: it is written and read only while a probe holds it,
// within a deadline, so an idle one costs a socket and nothing else.

// probeChannel is the probe connection's one channel.
const probeChannel = 1

// emptyContentHeader is a basic content header with body size 0 and no
// properties.
var emptyContentHeader = []byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// login is what the client logged in with, kept for the session's probe
// connection: the response holds the client's password.
type login struct {
	mechanism string
	response  []byte
	locale    string
}

// probeConn is an open probe connection; its holder is the prober's sem.
type probeConn struct {
	c    net.Conn
	r    *wire.Reader
	w    *wire.Writer
	open bool // probeChannel is open and in tx mode
}

// interrupt makes a read or write in progress, and the next ones, fail
// (a probe whose context ended).
func (pc *probeConn) interrupt() { _ = pc.c.SetDeadline(time.Unix(1, 0)) }

// dialProbe dials and opens a probe connection for the session within the
// handshake timeout. A *wire.Error is RabbitMQ's connection.close refusing
// the login or the vhost.
func (s *session) dialProbe(ctx context.Context) (pc *probeConn, err error) {
	deadline := time.Now().Add(s.srv.cfg.HandshakeTimeout)
	c, err := s.srv.dial(ctx, deadline)
	if err != nil {
		return nil, err
	}
	pc = &probeConn{c: c, r: wire.NewReader(c, 128<<10), w: wire.NewWriter(c)}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	stop := context.AfterFunc(ctx, pc.interrupt)
	defer stop()
	c.SetDeadline(deadline)
	if err := writeFrame(pc.w, wire.ProtocolHeader[:]); err != nil {
		return nil, err
	}
	if _, err := readMethod(pc.r, wire.IDConnectionStart); err != nil {
		return nil, err
	}
	if err := writeMethod(pc.w, 0, &wire.ConnectionStartOk{ClientProperties: s.probeProperties(),
		Mechanism: s.login.mechanism, Response: s.login.response, Locale: s.login.locale}); err != nil {
		return nil, err
	}
	f, err := readMethod(pc.r, 0)
	if err != nil {
		return nil, err
	}
	var tune wire.ConnectionTune
	switch id, _ := wire.PeekMethodID(f.Payload); id {
	case wire.IDConnectionTune:
		if err := tune.Decode(f.Payload[4:]); err != nil {
			return nil, err
		}
	case wire.IDConnectionClose:
		return nil, pc.refusedLogin(f.Payload)
	default: // connection.secure: no mechanism the proxy relays challenges
		return nil, fmt.Errorf("unexpected %v from RabbitMQ", id)
	}
	pc.w.Write(methodFrame(nil, 0, &wire.ConnectionTuneOk{ChannelMax: probeChannel, FrameMax: tune.FrameMax}))
	if err := writeMethod(pc.w, 0, &wire.ConnectionOpen{VirtualHost: s.info.VHost}); err != nil {
		return nil, err
	}
	if f, err = readMethod(pc.r, 0); err != nil {
		return nil, err
	}
	switch id, _ := wire.PeekMethodID(f.Payload); id {
	case wire.IDConnectionOpenOk:
	case wire.IDConnectionClose:
		return nil, pc.refusedLogin(f.Payload)
	default:
		return nil, fmt.Errorf("unexpected %v from RabbitMQ", id)
	}
	frameMax := tune.FrameMax
	if frameMax == 0 {
		frameMax = noLimitFrameMax
	}
	pc.r.SetMaxFrame(max(frameMax, 128<<10))
	c.SetDeadline(time.Time{})
	pc.w.Release()
	return pc, nil
}

// refusedLogin answers RabbitMQ's connection.close (payload) of a probe
// connection's handshake and returns it as a *wire.Error.
func (pc *probeConn) refusedLogin(payload []byte) error {
	var cm wire.ConnectionClose
	if err := cm.Decode(payload[4:]); err != nil {
		return err
	}
	writeMethod(pc.w, 0, &wire.ConnectionCloseOk{})
	return &wire.Error{Code: cm.ReplyCode, Text: cm.ReplyText}
}

// probeProperties are the probe connection's client properties: its name
// ("delayproxy permission probe for" the client's connection_name, so that
// tools that find a client's connections by the start of their name find
// the client's alone), the proxy's product and version, and
// authentication_failure_close (a refused login is told).
func (s *session) probeProperties() wire.Table {
	name := "delayproxy permission probe"
	if v, ok, _ := s.info.ClientProperties.Get("connection_name"); ok {
		if n, ok := v.(string); ok {
			name += " for " + n
		}
	}
	props := map[string]any{"connection_name": name, "product": "delayproxy",
		"capabilities": map[string]any{"authentication_failure_close": true}}
	if v := s.srv.cfg.Version; v != "" {
		props["version"] = v
	}
	t, err := wire.EncodeTable(props)
	if err != nil {
		panic(err) // strings and booleans always encode
	}
	return t
}

// probe asks RabbitMQ, within timeout, whether k may be published to. It
// returns nil when allowed, RabbitMQ's channel.close as a *wire.Error
// when refused, and any other error when the connection failed (it is
// then out of step: drop it).
func (pc *probeConn) probe(ctx context.Context, timeout time.Duration, k permKey) error {
	stop := context.AfterFunc(ctx, pc.interrupt)
	defer stop()
	pc.c.SetDeadline(time.Now().Add(timeout))
	var want []wire.MethodID
	if !pc.open {
		pc.w.Write(methodFrame(nil, probeChannel, &wire.ChannelOpen{}))
		pc.w.Write(methodFrame(nil, probeChannel, &wire.TxSelect{}))
		want = append(want, wire.IDChannelOpenOk, wire.IDTxSelectOk)
	}
	pc.w.Write(methodFrame(nil, probeChannel, &wire.BasicPublish{Exchange: k.exchange, RoutingKey: k.routingKey}))
	pc.w.Write(wire.AppendFrame(nil, wire.Frame{Type: wire.FrameHeader, Channel: probeChannel, Payload: emptyContentHeader}))
	if err := writeMethod(pc.w, probeChannel, &wire.TxRollback{}); err != nil {
		return err
	}
	want = append(want, wire.IDTxRollbackOk)
	for _, id := range want {
		m, err := pc.next()
		if err != nil {
			return err
		}
		if cm, ok := m.(*wire.ChannelClose); ok {
			pc.open = false
			if err := writeMethod(pc.w, probeChannel, &wire.ChannelCloseOk{}); err != nil {
				return err
			}
			return &wire.Error{Code: cm.ReplyCode, Text: cm.ReplyText}
		}
		if m.ID() != id {
			return fmt.Errorf("RabbitMQ answered %v, want %v", m.ID(), id)
		}
	}
	pc.open = true
	pc.c.SetDeadline(time.Time{})
	pc.w.Release()
	return nil
}

// next returns the next method on probeChannel. A connection.close from
// RabbitMQ is answered and returned as an error (not a *wire.Error: it
// judges no publish).
func (pc *probeConn) next() (wire.Method, error) {
	for {
		f, err := pc.r.ReadFrame()
		if err != nil {
			return nil, fmt.Errorf("reading the probe connection: %v", err)
		}
		if f.Type != wire.FrameMethod {
			continue
		}
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			return nil, fmt.Errorf("reading the probe connection: %v", err)
		}
		switch {
		case f.Channel == probeChannel:
			return m, nil
		case m.ID() == wire.IDConnectionClose:
			cm := m.(*wire.ConnectionClose)
			writeMethod(pc.w, 0, &wire.ConnectionCloseOk{})
			return nil, fmt.Errorf("RabbitMQ closed the probe connection: %s", cm.ReplyText)
		}
	}
}

// close closes the probe connection as a client does: connection.close,
// then the socket once RabbitMQ answered or timeout passed.
func (pc *probeConn) close(timeout time.Duration) {
	defer pc.c.Close()
	pc.c.SetDeadline(time.Now().Add(timeout))
	if writeMethod(pc.w, 0, &wire.ConnectionClose{ReplyCode: wire.ReplySuccess, ReplyText: "delayproxy: client connection closed"}) != nil {
		return
	}
	for {
		f, err := pc.r.ReadFrame()
		if err != nil {
			return
		}
		if f.Channel != 0 || f.Type != wire.FrameMethod {
			continue
		}
		if id, _ := wire.PeekMethodID(f.Payload); id == wire.IDConnectionCloseOk || id == wire.IDConnectionClose {
			return
		}
	}
}
