package amqpproxy

import (
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
)

// FuzzClientFrames sends arbitrary bytes after a completed handshake, to a
// proxy whose interceptor assembles every publish and sees queue and
// exchange declares, in front of the fake broker. The proxy must never
// panic, and every connection must end when the client hangs up (Cleanup
// waits for all goroutines).
func FuzzClientFrames(f *testing.F) {
	fb := startFakeBroker(f)
	hooks := &testHooks{methods: []wire.MethodID{wire.IDQueueDeclare, wire.IDExchangeDeclare, wire.IDTxCommit}}
	hooks.intercepts = func(_ *Channel, m *wire.BasicPublish) bool { return m.Exchange != "" }
	hooks.publish = func(p *Publish) {
		switch len(p.Body) % 3 {
		case 0:
			p.Relay()
		case 1:
			p.Ack()
		default:
			p.CloseChannel(wire.PreconditionFailed, "fuzz")
		}
	}
	hooks.method = func(c *Call) {
		c.Relay(nil, func(r *Reply) { r.Pass() })
	}
	p := startProxy(f, Config{Upstream: fb.url(), Interceptor: hooks, CloseTimeout: 100 * time.Millisecond})

	var seed []byte
	seed = append(seed, methodFrame(nil, 1, &wire.ChannelOpen{})...)
	seed = append(seed, methodFrame(nil, 1, &wire.ConfirmSelect{})...)
	seed = append(seed, methodFrame(nil, 1, &wire.BasicPublish{Exchange: "x"})...)
	seed = append(seed, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameHeader, Channel: 1, Payload: wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 60, BodySize: 4})})...)
	seed = append(seed, wire.AppendFrame(nil, wire.Frame{Type: wire.FrameBody, Channel: 1, Payload: []byte("body")})...)
	f.Add(seed)
	f.Add(append(methodFrame(nil, 1, &wire.ChannelOpen{}), methodFrame(nil, 1, &wire.ChannelClose{})...))
	f.Add(methodFrame(nil, 2, &wire.QueueDeclare{Queue: "q"}))
	f.Add([]byte{1, 0, 1, 0, 0, 0, 2, 0, 20, 0xCE})
	for _, tc := range malformedCases {
		c := &captureClient{}
		tc.send(c.rawClient())
		f.Add(c.buf)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		c := rawDial(t, p.addr)
		c.open(rawLogin{})
		if _, err := c.c.Write(data); err != nil {
			return
		}
		c.c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		for {
			if _, _, err := c.next(); err != nil {
				break
			}
		}
		c.c.Close()
	})
}

// captureClient records what a malformedCases sender writes.
type captureClient struct{ buf []byte }

func (c *captureClient) Write(p []byte) (int, error) {
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *captureClient) rawClient() *rawClient {
	return &rawClient{t: &testing.T{}, Conn: &rawamqp.Conn{W: wire.NewWriter(c)}}
}
