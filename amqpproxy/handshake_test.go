package amqpproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testcert"
	"github.com/delayproxy/delayproxy/internal/testforward"
	"github.com/delayproxy/delayproxy/internal/testserver"
)

// TestWrongLogin: a refused login is a refused login. amqp091-go does not
// announce authentication_failure_close and sees the socket close (as it
// would from RabbitMQ); a client that announces it gets 403 ACCESS_REFUSED.
func TestWrongLogin(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	// RabbitMQ waits a few seconds before it hangs up on a refused login:
	// the cases run side by side.
	t.Run("amqp091-go", func(t *testing.T) {
		t.Parallel()
		u := strings.Replace(p.url(t), "guest:guest@", "guest:wrong@", 1)
		if _, err := amqp.Dial(u); !errors.Is(err, amqp.ErrCredentials) {
			t.Fatalf("wrong password through the proxy: %v, want ErrCredentials", err)
		}
	})
	for _, tc := range []struct{ name, addr string }{{"direct", brokerAddr(t)}, {"proxy", p.addr}} {
		t.Run(tc.name+"/authentication_failure_close", func(t *testing.T) {
			t.Parallel()
			c := rawDial(t, tc.addr)
			m, err := c.login(rawLogin{pass: "wrong", props: map[string]any{
				"capabilities": map[string]any{"authentication_failure_close": true}}})
			if err != nil {
				t.Fatal(err)
			}
			cm, ok := m.(*wire.ConnectionClose)
			if !ok || cm.ReplyCode != wire.AccessRefused || !strings.HasPrefix(cm.ReplyText, "ACCESS_REFUSED - Login was refused") {
				t.Fatalf("wrong password answered with %#v", m)
			}
			c.send(0, &wire.ConnectionCloseOk{})
			c.expectHangup()
		})
		t.Run(tc.name+"/without the capability", func(t *testing.T) {
			t.Parallel()
			c := rawDial(t, tc.addr)
			if m, err := c.login(rawLogin{pass: "wrong"}); err == nil {
				t.Fatalf("the socket should close, got %#v", m)
			}
		})
	}
}

// TestVhostRefused: an unknown vhost, and one the user has no permission
// on, are refused with RabbitMQ's 530 NOT_ALLOWED.
func TestVhostRefused(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	forbidden := testbroker.UniqueName(t, "q")
	testbroker.Ctl(t, "add_vhost", forbidden) // guest has no permission there
	t.Cleanup(func() { testbroker.Ctl(t, "delete_vhost", forbidden) })
	for _, tc := range []struct{ vhost, reason string }{
		{"no-such-vhost", "vhost no-such-vhost not found"},
		{forbidden, "access to vhost '" + forbidden + "' refused for user 'guest'"},
	} {
		u := strings.TrimSuffix(p.url(t), "/") + "/" + tc.vhost
		_, err := amqp.Dial(u)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotAllowed || !strings.Contains(ae.Reason, tc.reason) {
			t.Fatalf("vhost %s: %v", tc.vhost, err)
		}
	}
}

// TestConnectionName: the client's properties reach RabbitMQ unchanged.
func TestConnectionName(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	name := testbroker.UniqueName(t, "q")
	p.dial(t, amqp.Config{Properties: amqp.Table{"connection_name": name, "x-test": "kept"}})
	out := testbroker.Ctl(t, "list_connections", "client_properties")
	if !strings.Contains(out, name) || !strings.Contains(out, "kept") {
		t.Fatalf("connection_name %q not in rabbitmqctl list_connections:\n%s", name, out)
	}
}

func TestBadProtocolHeader(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	for _, hdr := range []string{"HTTP/1.1 GET /\r\n\r\n", "AMQP\x00\x00\x09\x02", "AMQP\x01\x01\x00\x0a"} {
		c := rawDial(t, p.addr)
		c.raw([]byte(hdr))
		got, err := io.ReadAll(c.c)
		if !bytes.Equal(got, wire.ProtocolHeader[:]) || (err != nil && !isReset(err)) {
			t.Fatalf("header %q answered with %q, %v", hdr, got, err)
		}
	}
}

func TestHandshakeTimeout(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{HandshakeTimeout: 300 * time.Millisecond})
	c := rawDial(t, p.addr)
	start := time.Now()
	c.raw(wire.ProtocolHeader[:])
	c.expect(0, wire.IDConnectionStart)
	c.expectHangup()
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Fatalf("dropped after %v, want about 300ms", d)
	}
}

// TestChannelMax: channels beyond the negotiated channel_max are refused
// as RabbitMQ refuses them (by RabbitMQ: both hops have the client's
// tuning).
func TestChannelMax(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	for _, addr := range []string{brokerAddr(t), p.addr} {
		c := rawDial(t, addr)
		c.open(rawLogin{channelMax: 3})
		for _, ch := range []uint16{1, 7, 3} {
			c.send(ch, &wire.ChannelOpen{})
			c.expect(ch, wire.IDChannelOpenOk)
		}
		c.send(2, &wire.ChannelOpen{})
		cm := c.expectConnClose()
		if cm.ReplyCode != wire.NotAllowed || cm.ReplyText != "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)" {
			t.Fatalf("%s: %+v", addr, cm)
		}
	}
	// Closing a channel frees its place.
	c := rawDial(t, p.addr)
	c.open(rawLogin{channelMax: 1})
	for range 3 {
		c.send(1, &wire.ChannelOpen{})
		c.expect(1, wire.IDChannelOpenOk)
		c.send(1, &wire.ChannelClose{ReplyCode: 200})
		c.expect(1, wire.IDChannelCloseOk)
	}
}

func TestUpstreamUnreachable(t *testing.T) {
	t.Parallel()
	addr := crashtest.FreePort(t) // nothing listens there
	p := startProxy(t, Config{Upstream: "amqp://" + addr})
	_, err := amqp.Dial(p.url(t))
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.ConnectionForced || !strings.Contains(ae.Reason, "unreachable") || !strings.Contains(ae.Reason, addr) {
		t.Fatalf("dial with RabbitMQ down: %v", err)
	}
}

func TestTLSListener(t *testing.T) {
	t.Parallel()
	cert := testcert.New(t)
	p := startProxy(t, Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert.TLS}}})
	u := strings.Replace(p.url(t), "amqp://", "amqps://", 1)
	conn, err := amqp.DialTLS(u, &tls.Config{RootCAs: cert.Pool})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := testbroker.DeclareQueue(t, false, nil)
	ch := testbroker.Channel(t, conn)
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("over tls")})
	if d := get(t, ch, q, true); string(d.Body) != "over tls" {
		t.Fatalf("got %q", d.Body)
	}
	// Plain AMQP on the TLS port gets nowhere.
	if _, err := amqp.Dial(p.url(t)); err == nil {
		t.Fatal("plain AMQP accepted on the TLS listener")
	}
}

func TestTLSListenerFromFiles(t *testing.T) {
	t.Parallel()
	cert := testcert.New(t)
	dir := t.TempDir()
	certFile, keyFile := cert.Write(t, dir)
	p := startProxy(t, Config{CertFile: certFile, KeyFile: keyFile})
	u := strings.Replace(p.url(t), "amqp://", "amqps://", 1)
	conn, err := amqp.DialTLS(u, &tls.Config{RootCAs: cert.Pool})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if _, err := New(Config{Upstream: "amqp://x", CertFile: certFile, KeyFile: filepath.Join(dir, "missing")}); err == nil {
		t.Fatal("New accepted a missing key file")
	}
}

// TestUpstreamTLS: an amqps:// upstream, here a TLS terminator in front of
// RabbitMQ with a certificate made for the test.
func TestUpstreamTLS(t *testing.T) {
	t.Parallel()
	cert := testcert.New(t)
	tl := tls.NewListener(testserver.Listen(t), &tls.Config{Certificates: []tls.Certificate{cert.TLS}})
	fw := testforward.Start(t, tl, brokerAddr(t))
	p := startProxy(t, Config{Upstream: "amqps://" + fw.Addr(), UpstreamTLS: &tls.Config{RootCAs: cert.Pool}})
	ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
	q := testbroker.DeclareQueue(t, false, nil)
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("tls upstream")})
	if d := get(t, ch, q, true); string(d.Body) != "tls upstream" {
		t.Fatalf("got %q", d.Body)
	}
	// A certificate the proxy does not trust: the client is told why.
	p2 := startProxy(t, Config{Upstream: "amqps://" + fw.Addr()})
	_, err := amqp.Dial(p2.url(t))
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.ConnectionForced || !strings.Contains(ae.Reason, "certificate") {
		t.Fatalf("untrusted upstream certificate: %v", err)
	}
}

// TestAmqpTools drives librabbitmq's command-line tools (amqp-tools, a
// client not written in Go) through the proxy, over plain TCP and TLS.
func TestAmqpTools(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"amqp-declare-queue", "amqp-publish", "amqp-consume", "amqp-delete-queue"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (apt-get install amqp-tools; .ci/run does): %v", tool, err)
		}
	}
	cert := testcert.New(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, cert.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	plain := startProxy(t, Config{})
	secure := startProxy(t, Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert.TLS}}})
	for _, tc := range []struct {
		name string
		url  string
		tls  []string
	}{
		// No path in the URL: librabbitmq reads "/" as the empty vhost.
		{"tcp", "amqp://guest:guest@" + plain.addr, nil},
		{"tls", "amqps://guest:guest@localhost:" + port(secure.addr), []string{"--ssl", "--cacert=" + caFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := testbroker.UniqueName(t, "q")
			run := func(tool string, args ...string) string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, tool, append(append([]string{"--url=" + tc.url}, tc.tls...), args...)...)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
				}
				return string(out)
			}
			if got := strings.TrimSpace(run("amqp-declare-queue", "-q", q)); got != q {
				t.Fatalf("amqp-declare-queue printed %q", got)
			}
			t.Cleanup(func() { testbroker.DeleteQueue(t, q) })
			run("amqp-publish", "-r", q, "-p", "-H", "x-from: amqp-tools", "-b", "hello from C")
			if got := run("amqp-consume", "-q", q, "-c", "1", "cat"); got != "hello from C" {
				t.Fatalf("amqp-consume printed %q", got)
			}
		})
	}
}

func port(hostport string) string {
	_, p, _ := strings.Cut(hostport, ":")
	return p
}
