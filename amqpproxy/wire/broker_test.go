package wire

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// brokerConn speaks AMQP to the real RabbitMQ with nothing but this package.
type brokerConn struct {
	t    *testing.T
	conn net.Conn
	r    *Reader
	w    *Writer
	seen [][]byte // every frame RabbitMQ sent, raw
}

// read reads a frame and records a copy of it.
func (c *brokerConn) read() (Frame, error) {
	f, err := c.r.ReadFrame()
	if err == nil {
		raw := AppendFrame(nil, f)
		c.seen = append(c.seen, raw)
		f.Payload = raw[FrameHeaderSize : len(raw)-1]
	}
	return f, err
}

func dialBroker(t *testing.T) *brokerConn {
	t.Helper()
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", testbroker.Addr(t, u.String()), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	c := &brokerConn{t: t, conn: conn, r: NewReader(conn, FrameMinSize), w: NewWriter(conn)}
	if _, err := c.w.Write(ProtocolHeader[:]); err != nil {
		t.Fatal(err)
	}
	if err := c.w.Flush(); err != nil {
		t.Fatal(err)
	}

	start := expect[*ConnectionStart](c, 0)
	if start.VersionMajor != 0 || start.VersionMinor != 9 || !bytes.Contains(start.Mechanisms, []byte("PLAIN")) {
		t.Fatalf("connection.start: %+v", start)
	}
	v, ok, err := start.ServerProperties.Get("capabilities")
	if !ok || err != nil {
		t.Fatalf("server capabilities: %v %v", ok, err)
	}
	caps, err := decodeTable(v.(Table))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"publisher_confirms", "basic.nack", "consumer_cancel_notify", "exchange_exchange_bindings",
		"connection.blocked", "authentication_failure_close", "per_consumer_qos", "consumer_priorities", "direct_reply_to"} {
		if caps[c] != true {
			t.Errorf("RabbitMQ capability %s = %v", c, caps[c])
		}
	}
	pass, _ := u.User.Password()
	props, err := EncodeTable(map[string]any{"connection_name": "wire.broker_test", "product": "delayproxy wire test",
		"capabilities": map[string]any{"authentication_failure_close": true}})
	if err != nil {
		t.Fatal(err)
	}
	c.send(0, &ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN",
		Response: []byte("\x00" + u.User.Username() + "\x00" + pass), Locale: "en_US"})
	tune := expect[*ConnectionTune](c, 0)
	c.send(0, &ConnectionTuneOk{ChannelMax: tune.ChannelMax, FrameMax: tune.FrameMax, Heartbeat: 0})
	c.r.SetMaxFrame(tune.FrameMax)
	vhost := u.Path
	if len(vhost) > 0 {
		vhost = vhost[1:]
	}
	if vhost == "" {
		vhost = "/"
	}
	c.send(0, &ConnectionOpen{VirtualHost: vhost})
	expect[*ConnectionOpenOk](c, 0)
	t.Cleanup(func() {
		c.send(0, &ConnectionClose{ReplyCode: ReplySuccess, ReplyText: "bye"})
		for {
			f, err := c.read()
			if err != nil {
				return
			}
			if id, _ := PeekMethodID(f.Payload); f.Type == FrameMethod && id == IDConnectionCloseOk {
				return
			}
		}
	})
	return c
}

func (c *brokerConn) send(ch uint16, m Method) {
	c.t.Helper()
	if err := c.w.WriteFrame(Frame{Type: FrameMethod, Channel: ch, Payload: AppendMethod(nil, m)}); err != nil {
		c.t.Fatal(err)
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *brokerConn) publish(ch uint16, m *BasicPublish, props Properties, body []byte) {
	c.t.Helper()
	p := AppendMethod(nil, m)
	h := AppendContentHeader(nil, ContentHeader{ClassID: 60, BodySize: uint64(len(body)), Properties: appendProperties(nil, props)})
	for _, f := range []Frame{{Type: FrameMethod, Channel: ch, Payload: p}, {Type: FrameHeader, Channel: ch, Payload: h}, {Type: FrameBody, Channel: ch, Payload: body}} {
		if err := c.w.WriteFrame(f); err != nil {
			c.t.Fatal(err)
		}
	}
	if err := c.w.Flush(); err != nil {
		c.t.Fatal(err)
	}
}

// next reads the next method on ch, skipping heartbeats. Its tables alias a
// private copy of the frame.
func (c *brokerConn) next(ch uint16) Method {
	c.t.Helper()
	for {
		f, err := c.read()
		if err != nil {
			c.t.Fatalf("reading from RabbitMQ: %v", err)
		}
		if f.Type == FrameHeartbeat {
			continue
		}
		if f.Type != FrameMethod || f.Channel != ch {
			c.t.Fatalf("unexpected frame type %d on channel %d", f.Type, f.Channel)
		}
		m, err := DecodeMethod(bytes.Clone(f.Payload))
		if err != nil {
			c.t.Fatalf("decoding RabbitMQ's method: %v", err)
		}
		return m
	}
}

func expect[M Method](c *brokerConn, ch uint16) M {
	c.t.Helper()
	m := c.next(ch)
	got, ok := m.(M)
	if !ok {
		c.t.Fatalf("got %v %+v, want %T", m.ID(), m, got)
	}
	return got
}

// content reads a content header and its body on ch.
func (c *brokerConn) content(ch uint16) (Properties, []byte) {
	c.t.Helper()
	f, err := c.read()
	if err != nil || f.Type != FrameHeader || f.Channel != ch {
		c.t.Fatalf("content header: %v %+v", err, f)
	}
	h, err := DecodeContentHeader(bytes.Clone(f.Payload))
	if err != nil {
		c.t.Fatal(err)
	}
	props, err := DecodeProperties(h.Properties)
	if err != nil {
		c.t.Fatal(err)
	}
	var body []byte
	for uint64(len(body)) < h.BodySize {
		f, err := c.read()
		if err != nil || f.Type != FrameBody {
			c.t.Fatalf("body: %v %+v", err, f)
		}
		body = append(body, f.Payload...)
	}
	return props, body
}

// TestBrokerSpeaksOurCodec drives the real RabbitMQ with this package alone:
// RabbitMQ must accept what we encode (typed queue arguments it validates,
// headers-exchange bindings it matches against typed message headers, every
// property) and we must decode what it sends (start with nested
// capabilities, declare-ok, get-ok, return, ack, channel.close).
func TestBrokerSpeaksOurCodec(t *testing.T) {
	c := dialBroker(t)
	c.send(1, &ChannelOpen{})
	expect[*ChannelOpenOk](c, 1)

	suffix := fmt.Sprint(time.Now().UnixNano())
	q := "wire.test.q." + suffix
	ex := "wire.test.headers." + suffix

	// Queue arguments RabbitMQ checks by type: integers of several widths.
	qargs, err := EncodeTable(map[string]any{"x-max-priority": uint8(9), "x-message-ttl": int32(60000), "x-expires": int64(120000)})
	if err != nil {
		t.Fatal(err)
	}
	c.send(1, &QueueDeclare{Queue: q, AutoDelete: true, Arguments: qargs})
	if ok := expect[*QueueDeclareOk](c, 1); ok.Queue != q || ok.MessageCount != 0 {
		t.Fatalf("queue.declare-ok: %+v", ok)
	}
	c.send(1, &ExchangeDeclare{Exchange: ex, Type: "headers", AutoDelete: true})
	expect[*ExchangeDeclareOk](c, 1)
	// RabbitMQ's headers exchange compares binding and message values.
	bargs, err := EncodeTable(map[string]any{"x-match": "all", "s": "text", "n": int32(-5), "b": true})
	if err != nil {
		t.Fatal(err)
	}
	c.send(1, &QueueBind{Queue: q, Exchange: ex, Arguments: bargs})
	expect[*QueueBindOk](c, 1)

	c.send(1, &ConfirmSelect{})
	expect[*ConfirmSelectOk](c, 1)

	headers, err := EncodeTable(map[string]any{
		"s": "text", "n": int32(-5), "b": true, "x-delay": int64(-1500), "i8": int8(-1), "u8": uint8(2),
		"i16": int16(-3), "u16": uint16(4), "u32": uint32(6), "f32": float32(1.5), "f64": 2.25,
		"dec": Decimal{Scale: 2, Value: 314}, "bytes": []byte{0, 1}, "arr": []any{"a", int32(1), []any{true}},
		"ts": time.Unix(1700000000, 0), "nested": map[string]any{"k": "v"}, "void": nil,
	})
	if err != nil {
		t.Fatal(err)
	}
	sent := Properties{
		ContentType: "text/plain", ContentEncoding: "utf-8", Headers: headers, DeliveryMode: 2, Priority: 5,
		CorrelationID: "corr", ReplyTo: "reply", Expiration: "60000", MessageID: "m-1", Timestamp: 1700000000,
		Type: "kind", UserID: "guest", AppID: "wire-test",
	}
	body := bytes.Repeat([]byte("0123456789"), 1000) // one body frame, under frame_max
	c.publish(1, &BasicPublish{Exchange: ex, Mandatory: true}, sent, body)
	if ack := expect[*BasicAck](c, 1); ack.DeliveryTag != 1 || ack.Multiple {
		t.Fatalf("basic.ack: %+v", ack)
	}

	// An unroutable mandatory publish comes back as basic.return.
	c.publish(1, &BasicPublish{Exchange: ex, RoutingKey: "nowhere", Mandatory: true}, Properties{MessageID: "lost"}, []byte("x"))
	ret := expect[*BasicReturn](c, 1)
	if ret.ReplyCode != NoRoute || ret.ReplyText != "NO_ROUTE" || ret.Exchange != ex || ret.RoutingKey != "nowhere" {
		t.Fatalf("basic.return: %+v", ret)
	}
	if p, b := c.content(1); p.MessageID != "lost" || string(b) != "x" {
		t.Fatalf("returned content: %+v %q", p, b)
	}
	expect[*BasicAck](c, 1)

	c.send(1, &BasicGet{Queue: q, NoAck: true})
	getOk := expect[*BasicGetOk](c, 1)
	if getOk.Exchange != ex || getOk.Redelivered || getOk.MessageCount != 0 {
		t.Fatalf("basic.get-ok: %+v", getOk)
	}
	got, gotBody := c.content(1)
	sent.Flags = got.Flags
	if !reflect.DeepEqual(got, sent) || !bytes.Equal(gotBody, body) {
		t.Fatalf("RabbitMQ gave back\n%+v\nwant\n%+v", got, sent)
	}
	c.send(1, &BasicGet{Queue: q})
	expect[*BasicGetEmpty](c, 1)

	// A queue argument of the wrong type: RabbitMQ's channel.close decodes.
	bad, _ := EncodeTable(map[string]any{"x-max-priority": "high"})
	c.send(1, &QueueDeclare{Queue: q + ".bad", AutoDelete: true, Arguments: bad})
	closed := expect[*ChannelClose](c, 1)
	if closed.ReplyCode != PreconditionFailed || closed.ClassID != 50 || closed.MethodID != 10 {
		t.Fatalf("channel.close: %+v", closed)
	}
	c.send(1, &ChannelCloseOk{})
	writeCorpus(t, "rabbitmq", c.seen)
}
