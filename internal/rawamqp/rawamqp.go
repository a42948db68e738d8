// Package rawamqp is an AMQP 0-9-1 client that speaks frame by frame, for
// tests that need what amqp091-go will not do: malformed input, frames in
// the wrong order, silence, and idle connections that cost no goroutine.
// It has no state machine: what it sends is exactly what the caller asks.
package rawamqp

import (
	"fmt"
	"net"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/amqpurl"
)

// Conn is one raw client connection.
type Conn struct {
	C net.Conn
	R *wire.Reader
	W *wire.Writer
}

// Dial connects to addr (host:port).
func Dial(addr string, timeout time.Duration) (*Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &Conn{C: c, R: wire.NewReader(c, 1<<20), W: wire.NewWriter(c)}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.C.Close() }

// Raw writes b as it is and flushes.
func (c *Conn) Raw(b []byte) error {
	if _, err := c.W.Write(b); err != nil {
		return err
	}
	return c.W.Flush()
}

// Frame writes one frame.
func (c *Conn) Frame(typ uint8, ch uint16, payload []byte) error {
	return c.Raw(wire.AppendFrame(nil, wire.Frame{Type: typ, Channel: ch, Payload: payload}))
}

// Send writes one method frame.
func (c *Conn) Send(ch uint16, m wire.Method) error {
	return c.Frame(wire.FrameMethod, ch, wire.AppendMethod(nil, m))
}

// Next returns the next frame that is not a heartbeat, with its method
// decoded when it is a method frame.
func (c *Conn) Next() (wire.Frame, wire.Method, error) {
	for {
		f, err := c.R.ReadFrame()
		if err != nil {
			return f, nil, err
		}
		switch f.Type {
		case wire.FrameHeartbeat:
			continue
		case wire.FrameMethod:
			m, err := wire.DecodeMethod(f.Payload)
			return f, m, err
		}
		return f, nil, nil
	}
}

// Expect reads the next frame and returns its method if it is id on
// channel ch, else an error naming what came.
func (c *Conn) Expect(ch uint16, id wire.MethodID) (wire.Method, error) {
	f, m, err := c.Next()
	if err != nil {
		return nil, fmt.Errorf("want %v on channel %d: %w", id, ch, err)
	}
	if m == nil || m.ID() != id || f.Channel != ch {
		return nil, fmt.Errorf("want %v on channel %d, got frame type %d on channel %d: %#v", id, ch, f.Type, f.Channel, m)
	}
	return m, nil
}

// Login is what Handshake logs in with; zero fields take guest/guest on
// "/", PLAIN, the server's channel_max and frame_max, and no heartbeats.
type Login struct {
	User, Pass, VHost string
	ChannelMax        uint16
	FrameMax          uint32
	Heartbeat         uint16
	Properties        map[string]any
}

// Handshake runs the handshake up to the answer to connection.open and
// returns that answer (open-ok, or connection.close), or the server's
// answer to start-ok when it is not connection.tune.
func (c *Conn) Handshake(l Login) (wire.Method, error) {
	if l.User == "" {
		l.User = "guest"
	}
	if l.Pass == "" {
		l.Pass = "guest"
	}
	if l.VHost == "" {
		l.VHost = "/"
	}
	if err := c.Raw(wire.ProtocolHeader[:]); err != nil {
		return nil, err
	}
	if _, err := c.Expect(0, wire.IDConnectionStart); err != nil {
		return nil, err
	}
	props, err := wire.EncodeTable(l.Properties)
	if err != nil {
		return nil, err
	}
	if err := c.Send(0, &wire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN",
		Response: []byte("\x00" + l.User + "\x00" + l.Pass), Locale: "en_US"}); err != nil {
		return nil, err
	}
	_, m, err := c.Next()
	if err != nil {
		return nil, err
	}
	tune, ok := m.(*wire.ConnectionTune)
	if !ok {
		return m, nil
	}
	if l.ChannelMax == 0 {
		l.ChannelMax = tune.ChannelMax
	}
	if l.FrameMax == 0 {
		l.FrameMax = tune.FrameMax
	}
	if err := c.Send(0, &wire.ConnectionTuneOk{ChannelMax: l.ChannelMax, FrameMax: l.FrameMax, Heartbeat: l.Heartbeat}); err != nil {
		return nil, err
	}
	if err := c.Send(0, &wire.ConnectionOpen{VirtualHost: l.VHost}); err != nil {
		return nil, err
	}
	_, m, err = c.Next()
	return m, err
}

// Open runs the handshake and fails unless the connection opens.
func (c *Conn) Open(l Login) error {
	m, err := c.Handshake(l)
	if err != nil {
		return err
	}
	if m == nil || m.ID() != wire.IDConnectionOpenOk {
		return fmt.Errorf("connection.open answered with %#v", m)
	}
	return nil
}

// CloseReply reads until connection.close and returns it after answering
// close-ok; an error if the socket ends first (RabbitMQ's answer to some
// input is to hang up).
func (c *Conn) CloseReply() (*wire.ConnectionClose, error) {
	for {
		f, m, err := c.Next()
		if err != nil {
			return nil, err
		}
		if cm, ok := m.(*wire.ConnectionClose); ok && f.Channel == 0 {
			return cm, c.Send(0, &wire.ConnectionCloseOk{})
		}
	}
}

// DialURL connects to the amqp:// URL rawURL, logs in with its user and
// password (guest/guest where it names none) on vhost "/", and opens
// channel 1.
func DialURL(rawURL string, timeout time.Duration) (*Conn, error) {
	e, err := amqpurl.Parse(rawURL, nil)
	if err != nil {
		return nil, err
	}
	c, err := Dial(e.HostPort, timeout)
	if err != nil {
		return nil, err
	}
	err = c.Open(Login{User: e.User, Pass: e.Password})
	if err == nil {
		err = c.Send(1, &wire.ChannelOpen{})
	}
	if err == nil {
		_, err = c.Expect(1, wire.IDChannelOpenOk)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
