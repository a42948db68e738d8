package crashtest

import (
	"fmt"
	"net"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// RawConn speaks AMQP 0-9-1 frame by frame, for what amqp091-go will not
// do: malformed input, silence, and idle connections that cost the client
// no goroutine.
type RawConn struct {
	C net.Conn
	R *wire.Reader
	W *wire.Writer
}

// DialRaw connects to addr (host:port).
func DialRaw(addr string, timeout time.Duration) (*RawConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &RawConn{C: c, R: wire.NewReader(c, 1<<20), W: wire.NewWriter(c)}, nil
}

// Close closes the socket.
func (c *RawConn) Close() error { return c.C.Close() }

// Raw writes b as it is and flushes.
func (c *RawConn) Raw(b []byte) error {
	if _, err := c.W.Write(b); err != nil {
		return err
	}
	return c.W.Flush()
}

// Frame writes one frame.
func (c *RawConn) Frame(typ uint8, ch uint16, payload []byte) error {
	return c.Raw(wire.AppendFrame(nil, wire.Frame{Type: typ, Channel: ch, Payload: payload}))
}

// Send writes one method frame.
func (c *RawConn) Send(ch uint16, m wire.Method) error {
	return c.Frame(wire.FrameMethod, ch, wire.AppendMethod(nil, m))
}

// Next returns the next frame that is not a heartbeat, with its method
// decoded when it is a method frame.
func (c *RawConn) Next() (wire.Frame, wire.Method, error) {
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

// Login is what Open logs in with; zero fields take guest/guest on "/" and
// the server's tuning, with heartbeats off.
type Login struct {
	User, Pass, VHost string
	ChannelMax        uint16
	Heartbeat         uint16
	Properties        map[string]any
}

// Open runs the handshake up to connection.open-ok. Any other answer is
// an error naming it.
func (c *RawConn) Open(l Login) error {
	if l.User == "" {
		l.User, l.Pass = "guest", "guest"
	}
	if l.VHost == "" {
		l.VHost = "/"
	}
	if err := c.Raw(wire.ProtocolHeader[:]); err != nil {
		return err
	}
	if _, err := c.expect(wire.IDConnectionStart); err != nil {
		return err
	}
	props, err := wire.EncodeTable(l.Properties)
	if err != nil {
		return err
	}
	if err := c.Send(0, &wire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN",
		Response: []byte("\x00" + l.User + "\x00" + l.Pass), Locale: "en_US"}); err != nil {
		return err
	}
	m, err := c.expect(wire.IDConnectionTune)
	if err != nil {
		return err
	}
	tune := m.(*wire.ConnectionTune)
	chMax := tune.ChannelMax
	if l.ChannelMax != 0 {
		chMax = l.ChannelMax
	}
	if err := c.Send(0, &wire.ConnectionTuneOk{ChannelMax: chMax, FrameMax: tune.FrameMax, Heartbeat: l.Heartbeat}); err != nil {
		return err
	}
	c.R.SetMaxFrame(tune.FrameMax)
	if err := c.Send(0, &wire.ConnectionOpen{VirtualHost: l.VHost}); err != nil {
		return err
	}
	_, err = c.expect(wire.IDConnectionOpenOk)
	return err
}

// expect reads the next frame and returns its method if it is id on
// channel 0.
func (c *RawConn) expect(id wire.MethodID) (wire.Method, error) {
	f, m, err := c.Next()
	if err != nil {
		return nil, fmt.Errorf("waiting for %v: %w", id, err)
	}
	if m == nil || m.ID() != id || f.Channel != 0 {
		return nil, fmt.Errorf("waiting for %v: got frame type %d on channel %d: %#v", id, f.Type, f.Channel, m)
	}
	return m, nil
}

// CloseReply reads until connection.close and returns it after answering
// close-ok; an error if the socket ends first (RabbitMQ's answer to some
// input is to hang up).
func (c *RawConn) CloseReply() (*wire.ConnectionClose, error) {
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
