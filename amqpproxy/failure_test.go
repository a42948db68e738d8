package amqpproxy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testforward"
	"github.com/delayproxy/delayproxy/internal/testserver"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// malformedCases send something broken on an open connection; code is what
// RabbitMQ 3.10 answers with (0: it hangs up without connection.close).
var malformedCases = []struct {
	name string
	code uint16
	send func(c *rawClient)
}{
	{"frame larger than frame_max", wire.FrameError, func(c *rawClient) {
		c.frame(wire.FrameMethod, 1, make([]byte, 200000))
	}},
	{"bad frame-end octet", wire.FrameError, func(c *rawClient) {
		b := methodFrame(nil, 1, &wire.ChannelOpen{})
		b[len(b)-1] = 0xAB
		c.raw(b)
	}},
	{"unknown frame type", wire.FrameError, func(c *rawClient) { c.frame(9, 1, []byte{1, 2, 3}) }},
	{"heartbeat on a channel", wire.UnexpectedFrame, func(c *rawClient) { c.frame(wire.FrameHeartbeat, 1, nil) }},
	{"method frame shorter than its id", wire.FrameError, func(c *rawClient) { c.frame(wire.FrameMethod, 1, []byte{0, 20}) }},
	{"trailing bytes after a method", wire.FrameError, func(c *rawClient) {
		c.frame(wire.FrameMethod, 1, append(wire.AppendMethod(nil, &wire.ChannelOpen{}), 1, 2, 3))
	}},
	{"unknown method", 0, func(c *rawClient) { c.frame(wire.FrameMethod, 1, []byte{0, 20, 0, 99}) }},
	{"truncated basic.publish", wire.FrameError, func(c *rawClient) {
		c.send(1, &wire.ChannelOpen{})
		c.frame(wire.FrameMethod, 1, wire.AppendMethod(nil, &wire.BasicPublish{Exchange: "amq.direct"})[:8])
	}},
	{"body without a header", wire.UnexpectedFrame, func(c *rawClient) {
		c.send(1, &wire.ChannelOpen{})
		c.frame(wire.FrameBody, 1, []byte("hello"))
	}},
	{"header on a channel not open", wire.UnexpectedFrame, func(c *rawClient) { c.header(3, 1) }},
	{"method on a channel not open", wire.ChannelError, func(c *rawClient) { c.send(5, &wire.QueueDeclare{Queue: "x"}) }},
	{"second channel.open", wire.ChannelError, func(c *rawClient) {
		c.send(1, &wire.ChannelOpen{})
		c.send(1, &wire.ChannelOpen{})
	}},
	{"method in the middle of a content", wire.UnexpectedFrame, func(c *rawClient) {
		c.send(1, &wire.ChannelOpen{})
		c.send(1, &wire.BasicPublish{Exchange: "amq.direct"})
		c.header(1, 10)
		c.send(1, &wire.ChannelClose{ReplyCode: 200})
	}},
	{"method between basic.publish and its header", wire.UnexpectedFrame, func(c *rawClient) {
		c.send(1, &wire.ChannelOpen{})
		c.send(1, &wire.BasicPublish{Exchange: "amq.direct"})
		c.send(1, &wire.ChannelClose{ReplyCode: 200})
	}},
	{"content header of another class", wire.UnexpectedFrame, func(c *rawClient) {
		c.send(1, &wire.ChannelOpen{})
		c.send(1, &wire.BasicPublish{Exchange: "amq.direct"})
		c.frame(wire.FrameHeader, 1, wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 50}))
	}},
	{"channel method on channel 0", wire.ChannelError, func(c *rawClient) { c.send(0, &wire.ChannelOpen{}) }},
}

// TestMalformedFrames: broken input closes the connection through the proxy
// exactly as it does on RabbitMQ itself (same reply code, or the same
// silent hang-up), whether the proxy catches it or RabbitMQ does.
//
// "hooked" is a proxy with an Interceptor that takes nothing but is asked
// about every content header (InterceptsContent): it holds each publish's
// method frame until the frame after it, which must change nothing.
func TestMalformedFrames(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	hooked := startProxy(t, Config{Interceptor: &testHooks{content: func(*Channel, *wire.BasicPublish, []byte) bool { return false }}})
	for _, tc := range malformedCases {
		for _, target := range []struct{ name, addr string }{{"direct", brokerAddr(t)}, {"proxy", p.addr}, {"hooked", hooked.addr}} {
			t.Run(tc.name+"/"+target.name, func(t *testing.T) {
				t.Parallel()
				checkMalformed(t, target.addr, tc.code, tc.send)
			})
		}
	}
}

func checkMalformed(t *testing.T, addr string, code uint16, send func(*rawClient)) {
	c := rawDial(t, addr)
	c.open(rawLogin{})
	send(c)
	for {
		f, m, err := c.next()
		if err != nil {
			if code != 0 {
				t.Fatalf("socket closed (%v), want connection.close %d", err, code)
			}
			return
		}
		if f.Channel != 0 {
			continue // channel.open-ok and the like
		}
		cm, ok := m.(*wire.ConnectionClose)
		if !ok {
			t.Fatalf("got %#v", m)
		}
		if cm.ReplyCode != code {
			t.Fatalf("connection.close %d %q, want %d", cm.ReplyCode, cm.ReplyText, code)
		}
		if !strings.HasPrefix(cm.ReplyText, wire.ReplyText(code)+" - ") {
			t.Fatalf("reply text %q", cm.ReplyText)
		}
		c.send(0, &wire.ConnectionCloseOk{})
		c.expectHangup()
		return
	}
}

// TestUpstreamConnectionLost: when the upstream connection drops, the
// client gets connection.close 320 CONNECTION_FORCED with a reason.
func TestUpstreamConnectionLost(t *testing.T) {
	t.Parallel()
	fw := testforward.Start(t, testserver.Listen(t), brokerAddr(t))
	p := startProxy(t, Config{Upstream: "amqp://" + fw.Addr()})
	conn := p.dial(t, amqp.Config{})
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	testbroker.Channel(t, conn)
	fw.Cut()
	if e := testbroker.AwaitClose(t, closed, 10*time.Second); e.Code != amqp.ConnectionForced || !strings.Contains(e.Reason, "upstream connection lost") {
		t.Fatalf("closed with %v", e)
	}
}

// TestUpstreamMissedHeartbeats: a silent upstream is noticed within two
// heartbeat intervals and the client gets 320.
func TestUpstreamMissedHeartbeats(t *testing.T) {
	t.Parallel()
	fw := testforward.Start(t, testserver.Listen(t), brokerAddr(t))
	p := startProxy(t, Config{Upstream: "amqp://" + fw.Addr()})
	conn := p.dial(t, amqp.Config{Heartbeat: time.Second})
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	fw.Freeze()
	start := time.Now()
	if e := testbroker.AwaitClose(t, closed, 10*time.Second); e.Code != amqp.ConnectionForced || !strings.Contains(e.Reason, "missed heartbeats") {
		t.Fatalf("closed with %v", e)
	}
	if d := time.Since(start); d > 2800*time.Millisecond { // 2 s, and slack for a busy machine
		t.Fatalf("noticed after %v, want within two 1 s intervals", d)
	}
	fw.Unfreeze()
}

// TestClientMissedHeartbeats: a client that goes silent is dropped within
// two heartbeat intervals, and its upstream connection with it.
func TestClientMissedHeartbeats(t *testing.T) {
	t.Parallel()
	fw := testforward.Start(t, testserver.Listen(t), brokerAddr(t))
	p := startProxy(t, Config{Upstream: "amqp://" + fw.Addr()})
	c := rawDial(t, p.addr)
	c.open(rawLogin{heartbeat: 1})
	c.send(1, &wire.ChannelOpen{})
	c.expect(1, wire.IDChannelOpenOk)
	start := time.Now() // the client says nothing from now on
	beats := 0
	for {
		f, err := c.r.ReadFrame()
		if err != nil {
			break
		}
		if f.Type == wire.FrameHeartbeat {
			beats++
		}
	}
	if d := time.Since(start); d > 2800*time.Millisecond || d < 1500*time.Millisecond { // 2 s, and slack
		t.Fatalf("dropped after %v, want two 1 s intervals", d)
	}
	if beats < 2 {
		t.Fatalf("proxy sent %d heartbeats in two intervals", beats)
	}
	testwait.Until(t, 5*time.Second, "the upstream connection to close", func() bool { return fw.Open() == 0 })
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	conn := p.dial(t, amqp.Config{})
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	testbroker.Channel(t, conn)
	half := rawDial(t, p.addr) // in its handshake
	half.raw(wire.ProtocolHeader[:])
	half.expect(0, wire.IDConnectionStart)
	if err := p.srv.Shutdown(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Shutdown returned once the client answered connection.close;
	// amqp091-go reports the close on its own goroutine, maybe just after.
	if e := testbroker.AwaitClose(t, closed, 5*time.Second); e.Code != amqp.ConnectionForced || !strings.Contains(e.Reason, "shutting down") {
		t.Fatalf("closed with %v", e)
	}
	half.expectHangup()
	if _, err := amqp.Dial(p.url(t)); err == nil {
		t.Fatal("dial after Shutdown succeeded")
	}
}

// TestShutdownDeadline: a client that never answers connection.close is cut
// when Shutdown's context ends.
func TestShutdownDeadline(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	c := rawDial(t, p.addr)
	c.open(rawLogin{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
	cm := c.expect(0, wire.IDConnectionClose).(*wire.ConnectionClose)
	if cm.ReplyCode != wire.ConnectionForced {
		t.Fatalf("close %+v", cm)
	}
	c.expectHangup()
}

// TestBackPressure: a client that stops reading makes the proxy stop
// reading RabbitMQ; the proxy's queue stays within its bound, and nothing
// is lost once the client reads again.
func TestBackPressure(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	p := startProxy(t, Config{WriteQueueBytes: limit})
	q := testbroker.DeclareQueue(t, false, nil)
	producer := testbroker.Channel(t, testbroker.Dial(t, testbroker.URL(t)))
	if err := producer.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 64<<10)
	const n = 200 // 12.5 MiB: more than the socket buffers hold
	for range n {
		publish(t, producer, "", q, amqp.Publishing{Body: body})
	}
	c := rawDial(t, p.addr)
	c.open(rawLogin{})
	c.send(1, &wire.ChannelOpen{})
	c.expect(1, wire.IDChannelOpenOk)
	c.send(1, &wire.BasicConsume{Queue: q, NoAck: true})
	c.expect(1, wire.IDBasicConsumeOk)

	var s *session
	testwait.Until(t, 5*time.Second, "the session", func() bool {
		p.srv.mu.Lock()
		defer p.srv.mu.Unlock()
		for x := range p.srv.sessions {
			s = x
		}
		return s != nil
	})
	maxQueued := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		s.cw.q.mu.Lock()
		maxQueued = max(maxQueued, s.cw.q.bytes)
		s.cw.q.mu.Unlock()
	}
	if maxQueued > limit+131072 {
		t.Fatalf("client queue held %d bytes, bound %d plus a frame", maxQueued, limit)
	}
	if maxQueued < limit {
		t.Fatalf("client queue never filled (%d bytes): the test did not stall the proxy", maxQueued)
	}
	got := 0
	for got < n {
		f, _, err := c.next()
		if err != nil {
			t.Fatalf("after %d messages: %v", got, err)
		}
		if f.Type == wire.FrameMethod && f.Channel == 1 {
			got++
		}
	}
}

// TestHeartbeatOffer: Config.Heartbeat replaces RabbitMQ's proposal in
// connection.tune, 0 with none; what the client answers applies.
func TestHeartbeatOffer(t *testing.T) {
	t.Parallel()
	rabbit := offeredTune(t, brokerAddr(t)).Heartbeat
	if rabbit == 7 {
		t.Fatal("RabbitMQ proposes 7 s: pick another value below")
	}
	tests := []struct {
		name  string
		offer time.Duration
		want  uint16
	}{
		{"zero proposes none", 0, 0},
		{"positive replaces RabbitMQ's", 7 * time.Second, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProxy(t, Config{Heartbeat: tt.offer})
			if got := offeredTune(t, p.addr).Heartbeat; got != tt.want {
				t.Fatalf("proposed heartbeat %d s, want %d s", got, tt.want)
			}
			// A client that takes the proposal gets it on a working connection.
			conn := p.dial(t, amqp.Config{Heartbeat: time.Duration(max(tt.want, 1)) * time.Second})
			if got := conn.Config.Heartbeat; got != time.Duration(max(tt.want, 1))*time.Second {
				t.Fatalf("negotiated %v", got)
			}
			testbroker.Channel(t, conn)
		})
	}
}

// offeredTune logs in as guest at addr and returns the connection.tune it
// is offered.
func offeredTune(t *testing.T, addr string) *wire.ConnectionTune {
	t.Helper()
	c := rawDial(t, addr)
	c.raw(wire.ProtocolHeader[:])
	c.expect(0, wire.IDConnectionStart)
	c.send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: []byte("\x00guest\x00guest"), Locale: "en_US"})
	return c.expect(0, wire.IDConnectionTune).(*wire.ConnectionTune)
}
