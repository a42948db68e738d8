package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// Hostile input against the whole proxy (listener, interceptor, store),
// over raw TCP. The amqpproxy package tests the relay alone against the
// same cases and more: TestMalformedFrames (every malformed frame answered
// with RabbitMQ's code, checked against RabbitMQ itself), TestChannelMax
// (channels beyond the negotiated channel_max refused with RabbitMQ's 530
// and text, although the proxy keeps one upstream channel for itself),
// TestBadProtocolHeader, and FuzzClientFrames.

// rawDialT dials addr raw, with a 20 s deadline on everything; closed in
// t.Cleanup.
func rawDialT(t testing.TB, addr string) *rawamqp.Conn {
	t.Helper()
	c, err := rawamqp.Dial(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.C.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// isHangup reports whether err is the peer closing the socket.
func isHangup(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// awaitHangup reads until the peer closes the socket, ignoring what it
// sends (connection.start, heartbeats), and returns how long that took.
func awaitHangup(t testing.TB, c *rawamqp.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	buf := make([]byte, 4096)
	for {
		_, err := c.C.Read(buf)
		if err == nil {
			continue
		}
		if !isHangup(err) {
			t.Fatalf("want the socket closed by the proxy: %v", err)
		}
		return time.Since(start)
	}
}

// TestReliabilityHostile_HandshakeTimeout: a client that stops anywhere in
// the handshake, or trickles it, is dropped once the handshake timeout (1 s
// here) has passed since it connected; a trickle does not extend it.
func TestReliabilityHostile_HandshakeTimeout(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	tp := startProxy(t, func(c *delayproxy.Config) { c.HandshakeTimeout = timeout })
	addr := testbroker.Addr(t, tp.URL())
	startOk := func(c *rawamqp.Conn) error {
		return c.Send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: []byte("\x00guest\x00guest"), Locale: "en_US"})
	}
	cases := []struct {
		name string
		send func(c *rawamqp.Conn) error
	}{
		{"nothing at all", func(*rawamqp.Conn) error { return nil }},
		{"protocol header then nothing", func(c *rawamqp.Conn) error { return c.Raw(wire.ProtocolHeader[:]) }},
		{"start-ok then nothing", func(c *rawamqp.Conn) error {
			if err := c.Raw(wire.ProtocolHeader[:]); err != nil {
				return err
			}
			return startOk(c)
		}},
		{"tune-ok, no open", func(c *rawamqp.Conn) error {
			if err := c.Raw(wire.ProtocolHeader[:]); err != nil {
				return err
			}
			if err := startOk(c); err != nil {
				return err
			}
			return c.Send(0, &wire.ConnectionTuneOk{ChannelMax: 10, FrameMax: 131072})
		}},
		{"header one byte every 300 ms", func(c *rawamqp.Conn) error {
			for _, b := range wire.ProtocolHeader[:4] {
				if err := c.Raw([]byte{b}); err != nil {
					return nil // dropped already
				}
				time.Sleep(300 * time.Millisecond)
			}
			return nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := rawDialT(t, addr)
			connected := time.Now()
			if err := tc.send(c); err != nil {
				t.Fatal(err)
			}
			awaitHangup(t, c)
			d := time.Since(connected)
			if d < timeout-100*time.Millisecond || d > timeout+3*time.Second {
				t.Errorf("dropped %v after connecting, want about %v", d, timeout)
			}
			t.Logf("dropped after %v", d.Round(time.Millisecond))
		})
	}
}

// closeAnswer is how a server answered hostile input: a connection.close
// code, or 0 when it hung up without one.
func closeAnswer(t testing.TB, c *rawamqp.Conn) (uint16, string) {
	t.Helper()
	cm, err := c.CloseReply()
	if err != nil {
		if !isHangup(err) {
			t.Fatalf("want connection.close or a hang-up: %v", err)
		}
		return 0, ""
	}
	return cm.ReplyCode, cm.ReplyText
}

// TestReliabilityHostile_HugeFrame: a frame header announcing 0xFFFFFFF0
// bytes, right after the handshake, gets 501 FRAME_ERROR as from RabbitMQ,
// and costs the proxy nothing like its size: the reader refuses it at the
// header (process-wide TotalAlloc grows by far less than the announced 4
// GiB, or even the 1 MiB a reader would allocate up front). During the
// handshake the same frame ends the connection without a word, as RabbitMQ
// does. Not parallel: TotalAlloc counts the whole process.
func TestReliabilityHostile_HugeFrame(t *testing.T) {
	tp := startProxy(t, nil)
	huge := []byte{wire.FrameMethod, 0, 1, 0xFF, 0xFF, 0xFF, 0xF0, 1, 2, 3, 4, 5, 6, 7, 8}
	for _, target := range []struct{ name, addr string }{
		{"rabbitmq", testbroker.Addr(t, testbroker.URL(t))},
		{"proxy", testbroker.Addr(t, tp.URL())},
	} {
		t.Run("after handshake/"+target.name, func(t *testing.T) {
			c := rawDialT(t, target.addr)
			if err := c.Open(rawamqp.Login{}); err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			if err := c.Raw(huge); err != nil {
				t.Fatal(err)
			}
			code, text := closeAnswer(t, c)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d %q; %d KiB allocated meanwhile (whole process)", code, text, alloc>>10)
			if code != wire.FrameError {
				t.Errorf("answered %d %q, want 501 FRAME_ERROR", code, text)
			}
			if alloc > 512<<10 {
				t.Errorf("%d KiB allocated while refusing a frame header", alloc>>10)
			}
		})
	}
	// During the handshake the proxy hangs up at once, without a word.
	// (RabbitMQ 3.10 hangs up too, about 3 s later.)
	c := rawDialT(t, testbroker.Addr(t, tp.URL()))
	if err := c.Raw(wire.ProtocolHeader[:]); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := c.Raw(append([]byte{wire.FrameMethod, 0, 0}, huge[3:]...)); err != nil {
		t.Fatal(err)
	}
	if d := awaitHangup(t, c); d > 2*time.Second {
		t.Errorf("hung up %v after a 4 GiB frame header in the handshake, want at once", d)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<10 {
		t.Errorf("%d KiB allocated while refusing a frame header in the handshake", alloc>>10)
	}
}

// TestReliabilityHostile_Garbage: bytes that are not AMQP frames, after
// the handshake, close the connection with the code RabbitMQ uses for the
// same bytes (each case is sent to RabbitMQ too), and the proxy goes on
// serving: a client connected before still publishes delayed messages
// that are stored and released, and new clients connect.
func TestReliabilityHostile_Garbage(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	bystander := tp.dial(t)
	bch := confirmChannel(t, bystander)
	ex, q := delayedQueue(t, bch, "fanout", "")

	rng := rand.New(rand.NewPCG(6, 6))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	cases := []struct {
		name string
		data []byte
	}{
		{"http request", []byte("GET / HTTP/1.1\r\nHost: delayproxy\r\n\r\n")},
		{"tls client hello", []byte{0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03}},
		{"protocol header again", wire.ProtocolHeader[:]},
		{"zeros", make([]byte, 64)},
		{"random 4 KiB a", random(4096)},
		{"random 4 KiB b", random(4096)},
		{"valid frame then random", append(wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 1,
			Payload: wire.AppendMethod(nil, &wire.ChannelOpen{})}), random(512)...)},
		{"method frame of random payload", wire.AppendFrame(nil, wire.Frame{Type: wire.FrameMethod, Channel: 1, Payload: random(100)})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var answers [2]string
			for i, addr := range []string{testbroker.Addr(t, testbroker.URL(t)), testbroker.Addr(t, tp.URL())} {
				c := rawDialT(t, addr)
				if err := c.Open(rawamqp.Login{}); err != nil {
					t.Fatal(err)
				}
				if err := c.Raw(tc.data); err != nil && !isHangup(err) {
					t.Fatal(err)
				}
				code, text := closeAnswer(t, c)
				answers[i] = fmt.Sprint(code)
				if code != 0 && !bytes.HasPrefix([]byte(text), []byte(wire.ReplyText(code)+" - ")) {
					t.Errorf("reply text %q does not start as RabbitMQ's", text)
				}
				t.Logf("%s: %d %q", []string{"rabbitmq", "proxy"}[i], code, text)
			}
			if answers[0] != answers[1] {
				t.Errorf("RabbitMQ answers %s, the proxy %s", answers[0], answers[1])
			}
		})
	}
	// The proxy still serves the client that was there all along, and
	// new ones.
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)
	publishConfirmed(t, bch, ex, "", false, delayedMsg(int32(200), "after-garbage-1"))
	nch := confirmChannel(t, tp.dial(t))
	publishConfirmed(t, nch, ex, "", false, delayedMsg(int32(200), "after-garbage-2"))
	if as := got.wait(t, 2, 30*time.Second); len(as) != 2 {
		t.Errorf("got %d messages, want 2", len(as))
	}
	if bystander.IsClosed() {
		t.Error("the bystander's connection was closed")
	}
}
