package amqpproxy

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// rawClient is a rawamqp.Conn that fails the test on errors, for what
// amqp091-go will not do: malformed frames, frame order checks,
// capabilities, silence.
type rawClient struct {
	t testing.TB
	*rawamqp.Conn
	c net.Conn
	r *wire.Reader
}

func rawDial(t testing.TB, addr string) *rawClient {
	t.Helper()
	rc, err := rawamqp.Dial(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	rc.C.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{t: t, Conn: rc, c: rc.C, r: rc.R}
}

// brokerAddr is the test broker's host:port.
func brokerAddr(t testing.TB) string {
	t.Helper()
	return testbroker.Addr(t, testbroker.URL(t))
}

func (c *rawClient) raw(b []byte) {
	c.t.Helper()
	if err := c.Raw(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawClient) frame(typ uint8, ch uint16, payload []byte) {
	c.t.Helper()
	if err := c.Frame(typ, ch, payload); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawClient) send(ch uint16, m wire.Method) {
	c.t.Helper()
	if err := c.Send(ch, m); err != nil {
		c.t.Fatal(err)
	}
}

// header sends a basic content header with the given body size and no
// properties.
func (c *rawClient) header(ch uint16, size uint64) {
	c.t.Helper()
	c.frame(wire.FrameHeader, ch, wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 60, BodySize: size}))
}

// next returns the next frame that is not a heartbeat, with its method
// decoded when it is a method frame.
func (c *rawClient) next() (wire.Frame, wire.Method, error) { return c.Next() }

// expect reads the next frame and fails unless it is method id on channel ch.
func (c *rawClient) expect(ch uint16, id wire.MethodID) wire.Method {
	c.t.Helper()
	m, err := c.Expect(ch, id)
	if err != nil {
		c.t.Fatal(err)
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
	return c.Handshake(rawamqp.Login{User: l.user, Pass: l.pass, VHost: l.vhost,
		ChannelMax: l.channelMax, FrameMax: l.frameMax, Heartbeat: l.heartbeat, Properties: l.props})
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
