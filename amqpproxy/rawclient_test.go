package amqpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// rawClient speaks AMQP frame by frame, for what amqp091-go will not do:
// malformed frames, frame order checks, capabilities, silence.
type rawClient struct {
	t testing.TB
	c net.Conn
	r *wire.Reader
	w *wire.Writer
}

func rawDial(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{t: t, c: c, r: wire.NewReader(c, 1<<20), w: wire.NewWriter(c)}
}

// brokerAddr is the test broker's host:port.
func brokerAddr(t testing.TB) string {
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return u.Hostname() + ":5672"
	}
	return u.Host
}

func (c *rawClient) raw(b []byte) {
	c.t.Helper()
	if _, err := c.w.Write(b); err != nil {
		c.t.Fatal(err)
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawClient) frame(typ uint8, ch uint16, payload []byte) {
	c.t.Helper()
	c.raw(wire.AppendFrame(nil, wire.Frame{Type: typ, Channel: ch, Payload: payload}))
}

func (c *rawClient) send(ch uint16, m wire.Method) {
	c.t.Helper()
	c.raw(methodFrame(nil, ch, m))
}

// header sends a basic content header with the given body size and no
// properties.
func (c *rawClient) header(ch uint16, size uint64) {
	c.t.Helper()
	c.frame(wire.FrameHeader, ch, wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 60, BodySize: size}))
}

// next returns the next frame that is not a heartbeat, with its method
// decoded when it is a method frame.
func (c *rawClient) next() (wire.Frame, wire.Method, error) {
	for {
		f, err := c.r.ReadFrame()
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

// expect reads the next frame and fails unless it is method id on channel ch.
func (c *rawClient) expect(ch uint16, id wire.MethodID) wire.Method {
	c.t.Helper()
	f, m, err := c.next()
	if err != nil {
		c.t.Fatalf("want %v on channel %d: %v", id, ch, err)
	}
	if m == nil || m.ID() != id || f.Channel != ch {
		c.t.Fatalf("want %v on channel %d, got frame type %d on channel %d: %#v", id, ch, f.Type, f.Channel, m)
	}
	return m
}

type rawLogin struct {
	user, pass, vhost string
	channelMax        uint16
	frameMax          uint32
	heartbeat         uint16
	props             map[string]any
}

// login runs the handshake up to the answer to connection.open, which it
// returns (open-ok, or connection.close).
func (c *rawClient) login(l rawLogin) (wire.Method, error) {
	c.t.Helper()
	if l.user == "" {
		l.user = "guest"
	}
	if l.pass == "" {
		l.pass = "guest"
	}
	if l.vhost == "" {
		l.vhost = "/"
	}
	c.raw(wire.ProtocolHeader[:])
	if _, m, err := c.next(); err != nil || m.ID() != wire.IDConnectionStart {
		return m, fmt.Errorf("start: %v %v", m, err)
	}
	props, err := wire.EncodeTable(l.props)
	if err != nil {
		c.t.Fatal(err)
	}
	c.send(0, &wire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN",
		Response: []byte("\x00" + l.user + "\x00" + l.pass), Locale: "en_US"})
	_, m, err := c.next()
	if err != nil {
		return nil, err
	}
	tune, ok := m.(*wire.ConnectionTune)
	if !ok {
		return m, nil
	}
	if l.channelMax == 0 {
		l.channelMax = tune.ChannelMax
	}
	if l.frameMax == 0 {
		l.frameMax = tune.FrameMax
	}
	c.send(0, &wire.ConnectionTuneOk{ChannelMax: l.channelMax, FrameMax: l.frameMax, Heartbeat: l.heartbeat})
	c.send(0, &wire.ConnectionOpen{VirtualHost: l.vhost})
	_, m, err = c.next()
	return m, err
}

// open logs in as guest and fails unless the connection opens.
func (c *rawClient) open(l rawLogin) {
	c.t.Helper()
	m, err := c.login(l)
	if err != nil {
		c.t.Fatal(err)
	}
	if m.ID() != wire.IDConnectionOpenOk {
		c.t.Fatalf("connection.open answered with %#v", m)
	}
}

// expectConnClose reads until connection.close, answers close-ok and
// returns it; then the server must hang up.
func (c *rawClient) expectConnClose() *wire.ConnectionClose {
	c.t.Helper()
	for {
		f, m, err := c.next()
		if err != nil {
			c.t.Fatalf("want connection.close: %v", err)
		}
		if cm, ok := m.(*wire.ConnectionClose); ok && f.Channel == 0 {
			c.send(0, &wire.ConnectionCloseOk{})
			c.expectHangup()
			return cm
		}
	}
}

// expectHangup fails unless the peer closes the socket (EOF or reset)
// without sending another frame than heartbeats.
func (c *rawClient) expectHangup() {
	c.t.Helper()
	_, m, err := c.next()
	if err == nil {
		c.t.Fatalf("want the socket closed, got %#v", m)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("want the socket closed: %v", err)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
		c.t.Fatalf("want the socket closed: %v", err)
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}
