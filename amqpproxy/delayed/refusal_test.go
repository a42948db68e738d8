package delayed_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// A refusal the proxy makes itself reaches the client as RabbitMQ's own
// refusals do, also when the client's channel.close is already on its way:
// RabbitMQ answers a publish to a missing exchange followed at once by
// channel.close with channel.close 404, then close-ok for the client's
// close, and waits for the client's close-ok. amqp-tools' amqp-publish
// writes basic.publish and channel.close in one write and exits 0 if its
// close is answered with close-ok.

// refusalCase is one kind of refusal the proxy makes, how to provoke it
// with amqp-publish, and what the client must be told.
type refusalCase struct {
	name  string
	dcfg  delayed.Config
	pcfg  amqpproxy.Config
	args  []string // amqp-publish arguments besides --url, -e and -r
	user  bool     // publish as a user who may not write to the exchange
	setup func(t *testing.T, r *wireRelay)
	code  int
	text  string // the reply text, or its start
}

var refusalCases = []refusalCase{
	{name: "invalid x-delay", args: []string{"-H", "x-delay: abc", "-b", "hello"},
		code: 406, text: "PRECONDITION_FAILED - invalid x-delay header: abc"},
	{name: "x-delay too long", dcfg: delayed.Config{MaxDelay: time.Hour}, args: []string{"-H", "x-delay: 7200000", "-b", "hello"},
		code: 406, text: "PRECONDITION_FAILED - x-delay 7200000 ms is larger than the maximum delay 3600000 ms"},
	{name: "too large", pcfg: amqpproxy.Config{MaxMessageSize: 64}, args: []string{"-H", "x-delay: 1000", "-b", strings.Repeat("x", 100)},
		code: 406, text: "PRECONDITION_FAILED - message size 100 is larger than configured max size 64"},
	// text "": RabbitMQ's own, from the same publish straight to it.
	{name: "no write permission", user: true, args: []string{"-H", "x-delay: 1000", "-b", "hello"}, code: 403},
	{name: "store failure", args: []string{"-H", "x-delay: 1000", "-b", "hello"},
		setup: func(t *testing.T, r *wireRelay) {
			if err := r.st.Close(); err != nil { // a real bbolt store, closed under the proxy
				t.Fatal(err)
			}
		},
		code: 506, text: "RESOURCE_ERROR - cannot store delayed message: store: closed"},
}

// TestRefusalReachesAmqpPublish: for every refusal the proxy makes, the
// client that publishes and closes its channel in one write
// (amqp-publish) is told, as it is told RabbitMQ's own refusals: exit
// status 1 and the code and text on stderr; nothing is stored.
func TestRefusalReachesAmqpPublish(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("amqp-publish"); err != nil {
		t.Fatalf("amqp-publish not installed (apt-get install amqp-tools; .ci/clients does): %v", err)
	}
	for _, b := range testbroker.Brokers(t) {
		t.Run(b.Name+"/RabbitMQ's own: missing exchange", func(t *testing.T) {
			t.Parallel()
			u := strings.TrimSuffix(b.URL, "/") + "/%2f"
			code, stderr := amqpPublish(t, u, "dp-wire.no-such-exchange", "hello")
			if want := "server channel error 404, message: NOT_FOUND - no exchange 'dp-wire.no-such-exchange'"; code != 1 || !strings.Contains(stderr, want) {
				t.Fatalf("amqp-publish straight to RabbitMQ: exit %d, stderr %q; want 1 and %q", code, stderr, want)
			}
		})
		user, pass := fmt.Sprintf("dp-wire-%d", time.Now().UnixNano()), "secret"
		userMade := false
		for _, tc := range refusalCases {
			if tc.user && !userMade {
				b.AddUser(t, user, pass)
				b.Ctl(t, "set_permissions", "-p", "/", user, "", "", ".*")
				userMade = true
			}
			t.Run(b.Name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				r := startWireRelay(t, b, tc.dcfg, tc.pcfg)
				ex, _ := r.declare(t)
				if tc.setup != nil {
					tc.setup(t, r)
				}
				u := r.url("guest", "guest")
				if tc.user {
					u = r.url(user, pass)
				}
				text := tc.text
				if text == "" {
					direct := strings.TrimSuffix(b.URL, "/") + "/%2f"
					if tc.user {
						direct = strings.Replace(direct, "guest:guest@", user+":"+pass+"@", 1)
					}
					code, stderr := amqpPublish(t, direct, ex, tc.args...)
					_, text, _ = strings.Cut(strings.TrimSpace(stderr), "message: ")
					if code != 1 || text == "" {
						t.Fatalf("amqp-publish straight to RabbitMQ: exit %d, stderr %q", code, stderr)
					}
				}
				code, stderr := amqpPublish(t, u, ex, tc.args...)
				want := fmt.Sprintf("server channel error %d, message: %s", tc.code, text)
				if code != 1 || !strings.Contains(stderr, want) {
					t.Fatalf("amqp-publish: exit %d, stderr %q; want exit 1 and %q", code, stderr, want)
				}
				if tc.setup == nil {
					if n := r.stored(t, ex); n != 0 {
						t.Fatalf("%d messages stored after a refusal", n)
					}
				}
			})
		}
	}
}

// amqpPublish runs amqp-publish against u to exchange ex, routing key "k",
// and returns its exit status and standard error.
func amqpPublish(t *testing.T, u, ex string, args ...string) (int, string) {
	t.Helper()
	if len(args) == 1 { // a body only
		args = []string{"-b", args[0]}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "amqp-publish", append([]string{"--url=" + u, "-e", ex, "-r", "k"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("amqp-publish: %v", err)
	return 0, ""
}

// refusalFrames opens a raw connection at addr, writes publish (method,
// header with the given headers, body "hello") and channel.close in one
// write on channel 1, and returns the methods that come back before the
// server falls silent. It then answers close-ok and checks that channel 1
// opens again.
func refusalFrames(t *testing.T, addr, exchange string, headers map[string]any) []wire.Method {
	t.Helper()
	c, err := rawamqp.Dial(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.C.SetDeadline(time.Now().Add(20 * time.Second))
	if err := c.Open(rawamqp.Login{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(1, &wire.ChannelOpen{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Expect(1, wire.IDChannelOpenOk); err != nil {
		t.Fatal(err)
	}
	h, err := wire.EncodeTable(headers)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("hello")
	props := append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint16(nil, wire.FlagHeaders), uint32(len(h))), h...)
	var b []byte
	b = wire.AppendFrame(b, wire.Frame{Type: wire.FrameMethod, Channel: 1,
		Payload: wire.AppendMethod(nil, &wire.BasicPublish{Exchange: exchange, RoutingKey: "k"})})
	b = wire.AppendFrame(b, wire.Frame{Type: wire.FrameHeader, Channel: 1,
		Payload: wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 60, BodySize: uint64(len(body)),
			Properties: props})})
	b = wire.AppendFrame(b, wire.Frame{Type: wire.FrameBody, Channel: 1, Payload: body})
	b = wire.AppendFrame(b, wire.Frame{Type: wire.FrameMethod, Channel: 1,
		Payload: wire.AppendMethod(nil, &wire.ChannelClose{ReplyCode: wire.ReplySuccess, ReplyText: "bye"})})
	if err := c.Raw(b); err != nil {
		t.Fatal(err)
	}
	var got []wire.Method
	for {
		c.C.SetReadDeadline(time.Now().Add(time.Second))
		f, m, err := c.Next()
		if err != nil {
			var ne interface{ Timeout() bool }
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("after %d methods: %v", len(got), err)
			}
			break
		}
		if f.Channel != 1 || m == nil {
			t.Fatalf("frame type %d on channel %d: %#v", f.Type, f.Channel, m)
		}
		got = append(got, m)
	}
	c.C.SetDeadline(time.Now().Add(20 * time.Second))
	if err := c.Send(1, &wire.ChannelCloseOk{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(1, &wire.ChannelOpen{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Expect(1, wire.IDChannelOpenOk); err != nil {
		t.Fatalf("channel 1 after the refusal: %v", err)
	}
	return got
}

// TestRefusalFramesMatchRabbitMQ: publish and channel.close in one write.
// RabbitMQ, for a missing exchange: channel.close 404 (class 60, method 40),
// then channel.close-ok for the client's close; the channel opens again
// after the client's close-ok. The proxy, for its own refusals, a quick
// one (invalid x-delay, judged as the publish is read) and one that comes
// from the store after the client's close was read: the same frames with
// its code.
func TestRefusalFramesMatchRabbitMQ(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		direct := refusalFrames(t, b.Addr(t), "dp-wire.no-such-exchange", nil)
		checkRefusalFrames(t, "RabbitMQ, missing exchange", direct, wire.NotFound)

		r := startWireRelay(t, b, delayed.Config{}, amqpproxy.Config{})
		ex, _ := r.declare(t)
		checkRefusalFrames(t, "proxy, invalid x-delay", refusalFrames(t, r.addr, ex, map[string]any{"x-delay": "abc"}), wire.PreconditionFailed)
		if err := r.st.Close(); err != nil {
			t.Fatal(err)
		}
		checkRefusalFrames(t, "proxy, store failure", refusalFrames(t, r.addr, ex, map[string]any{"x-delay": int32(1000)}), wire.ResourceError)
	})
}

func checkRefusalFrames(t *testing.T, who string, got []wire.Method, code uint16) {
	t.Helper()
	var cm *wire.ChannelClose
	if len(got) == 2 {
		cm, _ = got[0].(*wire.ChannelClose)
	}
	if cm == nil || got[1].ID() != wire.IDChannelCloseOk || cm.ReplyCode != code || cm.ClassID != 60 || cm.MethodID != 40 {
		t.Fatalf("%s: got %s, want channel.close %d (60, 40) then channel.close-ok", who, describeMethods(got), code)
	}
	t.Logf("%s: %s", who, describeMethods(got))
}

func describeMethods(ms []wire.Method) string {
	var parts []string
	for _, m := range ms {
		if cm, ok := m.(*wire.ChannelClose); ok {
			parts = append(parts, fmt.Sprintf("channel.close %d %q (%d, %d)", cm.ReplyCode, cm.ReplyText, cm.ClassID, cm.MethodID))
			continue
		}
		parts = append(parts, m.ID().String())
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
