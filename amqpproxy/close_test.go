package amqpproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// The closing handshake as RabbitMQ runs it (rabbit_reader.erl): after it
// sends connection.close-ok it keeps reading, and dropping, until the client
// hangs up; the socket goes only when the client closed it or a bound
// passed. These tests hold the proxy to the same, on both brokers.

// TestCloseNotifyCloseReportsNil: amqp091-go's NotifyClose reports nothing
// (the channel is closed without an error) after a normal Close(), round
// after round. A proxy that hangs up as soon as it has sent close-ok races
// the client's own shutdown: its reader sees EOF first and reports
// Exception (501) "EOF".
func TestCloseNotifyCloseReportsNil(t *testing.T) {
	t.Parallel()
	const rounds, workers = 200, 4
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		u := p.url(t)
		var next, bad atomic.Int64
		var mu sync.Mutex // guards first
		var first error
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for next.Add(1) <= rounds {
					if err := closeOnce(u); err != nil {
						bad.Add(1)
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if n := bad.Load(); n > 0 {
			t.Fatalf("%d of %d normal closes through the proxy reported an error; the first: %v", n, rounds, first)
		}
	})
}

// closeOnce dials u, opens a channel, closes the connection and returns
// what NotifyClose reported, if anything.
func closeOnce(u string) error {
	c, err := amqp.Dial(u)
	if err != nil {
		return err
	}
	closed := c.NotifyClose(make(chan *amqp.Error, 1))
	if _, err := c.Channel(); err != nil {
		c.Close()
		return err
	}
	if err := c.Close(); err != nil {
		return err
	}
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			return e
		}
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("NotifyClose never reported")
	}
}

// TestCloseAmqplib: amqplib publishes and then closes; its close callback
// fires and the connection closes without ECONNRESET, round after round.
func TestCloseAmqplib(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		out, err := runNode(t, "amqplib_close.js", p.url(t), "50")
		if err != nil {
			t.Fatalf("amqplib through the proxy: %v\n%s", err, out)
		}
	})
}

// runNode runs a script of testdata with node and amqplib as .ci/clients
// installs it (CLIENTS_NODE_DIR, default /var/lib/delayproxy-ci/node).
func runNode(t *testing.T, script string, args ...string) ([]byte, error) {
	t.Helper()
	dir := os.Getenv("CLIENTS_NODE_DIR")
	if dir == "" {
		dir = "/var/lib/delayproxy-ci/node"
	}
	modules := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "amqplib")); err != nil {
		t.Fatalf("amqplib is not installed (bash .ci/clients installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join("testdata", script)}, args...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	return cmd.CombinedOutput()
}

// TestCloseLingers: after connection.close-ok the socket stays open, and
// what the client sent after its connection.close is read (no reset), until
// the client hangs up; compared with RabbitMQ itself.
func TestCloseLingers(t *testing.T) {
	t.Parallel()
	for _, b := range testbroker.Brokers(t) {
		p := startProxyOn(t, b, Config{})
		for _, tc := range []struct{ name, addr string }{{"direct", b.Addr(t)}, {"proxy", p.addr}} {
			t.Run(b.Name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				c := rawDial(t, tc.addr)
				c.open(rawLogin{})
				c.send(1, &wire.ChannelOpen{})
				c.expect(1, wire.IDChannelOpenOk)
				// connection.close with bytes behind it that the server
				// reads only after its close-ok: a heartbeat and a method on
				// a channel now closing.
				var b []byte
				b = methodFrame(b, 0, &wire.ConnectionClose{ReplyCode: wire.ReplySuccess, ReplyText: "bye"})
				b = append(b, heartbeatFrame...)
				b = methodFrame(b, 1, &wire.BasicQos{PrefetchCount: 1})
				c.raw(b)
				c.expect(0, wire.IDConnectionCloseOk)
				c.raw(heartbeatFrame)
				c.c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				if n, err := c.c.Read(make([]byte, 1)); !isTimeout(err) {
					t.Fatalf("after close-ok the server hung up (read %d bytes, %v); RabbitMQ waits for the client", n, err)
				}
				// The client hangs up first, as it should; then so does the
				// server (RabbitMQ with a reset: it sets SO_LINGER 0, which
				// only a half-closed client like this one can see).
				if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.expectHangup()
			})
		}
	}
}

// TestCloseLingerBounded: a client that never hangs up after close-ok is
// dropped once the close timeout has passed (RabbitMQ's bound is the
// heartbeat, at most 30 s; the proxy's is Config.CloseTimeout), and so is
// one that never answers the proxy's own connection.close.
func TestCloseLingerBounded(t *testing.T) {
	t.Parallel()
	const bound = 400 * time.Millisecond
	p := startProxy(t, Config{CloseTimeout: bound})
	t.Run("after close-ok", func(t *testing.T) {
		t.Parallel()
		c := rawDial(t, p.addr)
		c.open(rawLogin{})
		c.send(0, &wire.ConnectionClose{ReplyCode: wire.ReplySuccess})
		c.expect(0, wire.IDConnectionCloseOk)
		start := time.Now()
		c.expectHangup()
		if d := time.Since(start); d < bound*3/4 || d > bound+3*time.Second {
			t.Fatalf("dropped %v after close-ok, want about %v", d, bound)
		}
	})
	t.Run("no close-ok", func(t *testing.T) {
		t.Parallel()
		p := startProxy(t, Config{CloseTimeout: bound})
		c := rawDial(t, p.addr)
		c.open(rawLogin{})
		shut := make(chan error, 1)
		go func() { shut <- p.srv.Shutdown(ctxTimeout(t, 20*time.Second)) }()
		c.expect(0, wire.IDConnectionClose)
		start := time.Now()
		c.expectHangup() // this client never answers
		if d := time.Since(start); d < bound*3/4 || d > bound+3*time.Second {
			t.Fatalf("dropped %v after connection.close, want about %v", d, bound)
		}
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	})
}

// TestCloseShutdownWaitsForCloseOk: at shutdown the proxy sends 320 and
// reads (and drops) what the client still sends until its close-ok; then
// it hangs up, as RabbitMQ does, without a reset.
func TestCloseShutdownWaitsForCloseOk(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	c := rawDial(t, p.addr)
	c.open(rawLogin{})
	c.send(1, &wire.ChannelOpen{})
	c.expect(1, wire.IDChannelOpenOk)
	shut := make(chan error, 1)
	go func() { shut <- p.srv.Shutdown(ctxTimeout(t, 20*time.Second)) }()
	cm := c.expect(0, wire.IDConnectionClose).(*wire.ConnectionClose)
	if cm.ReplyCode != wire.ConnectionForced {
		t.Fatalf("closed with %+v, want 320", cm)
	}
	// Frames the client had in flight, then a pause: still no hangup.
	for range 3 {
		c.send(1, &wire.BasicQos{PrefetchCount: 1})
		c.raw(heartbeatFrame)
	}
	c.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.c.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("the proxy hung up before close-ok (read %d bytes, %v)", n, err)
	}
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	c.send(0, &wire.ConnectionCloseOk{})
	if _, err := io.ReadAll(c.c); err != nil {
		t.Fatalf("after close-ok: %v, want EOF", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestCloseHandshakeRefusalWaitsForCloseOk: when the proxy refuses a
// connection in its handshake (RabbitMQ unreachable: 320 after start-ok),
// it drops what the client sends until its close-ok, as RabbitMQ's closed
// state does, then hangs up.
func TestCloseHandshakeRefusalWaitsForCloseOk(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{Upstream: "amqp://" + crashtest.FreePort(t)})
	c := rawDial(t, p.addr)
	c.raw(wire.ProtocolHeader[:])
	c.expect(0, wire.IDConnectionStart)
	c.send(0, &wire.ConnectionStartOk{Mechanism: "PLAIN", Response: []byte("\x00guest\x00guest"), Locale: "en_US"})
	if cm := c.expect(0, wire.IDConnectionClose).(*wire.ConnectionClose); cm.ReplyCode != wire.ConnectionForced {
		t.Fatalf("closed with %+v, want 320", cm)
	}
	c.raw(heartbeatFrame)
	c.send(1, &wire.ChannelOpen{})
	c.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.c.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("the proxy hung up before close-ok (read %d bytes, %v)", n, err)
	}
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	c.send(0, &wire.ConnectionCloseOk{})
	c.expectHangup()
}
