package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeServer is an in-memory AMQP peer written with this package: it
// answers a client's handshake and synchronous methods and records what the
// client sent. It is a codec test harness, not a broker.
type fakeServer struct {
	conn    net.Conn
	methods []Method // every method the client sent, decoded
	frames  [][]byte // every frame the client sent, raw, after the protocol header
	header  ContentHeader
	props   Properties
	body    []byte
}

func (s *fakeServer) run() error {
	defer s.conn.Close()
	if err := ReadProtocolHeader(s.conn); err != nil {
		return err
	}
	r := NewReader(s.conn, 131072)
	w := NewWriter(s.conn)
	send := func(ch uint16, m Method) error {
		if err := w.WriteFrame(Frame{Type: FrameMethod, Channel: ch, Payload: AppendMethod(nil, m)}); err != nil {
			return err
		}
		return w.Flush()
	}
	caps, err := EncodeTable(map[string]any{"publisher_confirms": true, "basic.nack": true, "exchange_exchange_bindings": true})
	if err != nil {
		return err
	}
	serverProps, err := EncodeTable(map[string]any{"product": "fake", "capabilities": caps})
	if err != nil {
		return err
	}
	if err := send(0, &ConnectionStart{VersionMajor: 0, VersionMinor: 9, ServerProperties: serverProps,
		Mechanisms: []byte("PLAIN AMQPLAIN"), Locales: []byte("en_US")}); err != nil {
		return err
	}
	var confirming bool
	var confirmTag uint64
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return err
		}
		// Decoded tables alias the payload, which the next ReadFrame
		// overwrites: keep a copy.
		raw := AppendFrame(nil, f)
		s.frames = append(s.frames, raw)
		f.Payload = raw[FrameHeaderSize : len(raw)-1]
		switch f.Type {
		case FrameHeader:
			if s.header, err = DecodeContentHeader(f.Payload); err != nil {
				return err
			}
			if s.props, err = DecodeProperties(s.header.Properties); err != nil {
				return err
			}
			continue
		case FrameBody:
			s.body = append(s.body, f.Payload...)
			if uint64(len(s.body)) == s.header.BodySize && confirming {
				if err := send(f.Channel, &BasicAck{DeliveryTag: confirmTag}); err != nil {
					return err
				}
			}
			continue
		case FrameHeartbeat:
			continue
		}
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			return err
		}
		s.methods = append(s.methods, m)
		var reply Method
		switch m.(type) {
		case *ConnectionStartOk:
			reply = &ConnectionTune{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 0}
		case *ConnectionOpen:
			reply = &ConnectionOpenOk{}
		case *ChannelOpen:
			reply = &ChannelOpenOk{}
		case *ExchangeDeclare:
			reply = &ExchangeDeclareOk{}
		case *ConfirmSelect:
			reply = &ConfirmSelectOk{}
			confirming = true
		case *BasicPublish:
			confirmTag++
		case *ChannelClose:
			reply = &ChannelCloseOk{}
		case *ConnectionClose:
			return send(0, &ConnectionCloseOk{})
		}
		if nw := reflect.ValueOf(m).Elem().FieldByName("NoWait"); reply != nil && !(nw.IsValid() && nw.Bool()) {
			if err := send(f.Channel, reply); err != nil {
				return err
			}
		}
	}
}

// TestDecodeWhatAmqp091GoWrites runs the amqp091-go client against the fake
// server and checks that every frame it writes decodes to what the client
// was asked to send: the handshake, channel.open, exchange.declare with a
// table of every type amqp091-go writes, confirm.select, and basic.publish
// with every property and a body.
func TestDecodeWhatAmqp091GoWrites(t *testing.T) {
	clientEnd, serverEnd := net.Pipe()
	srv := &fakeServer{conn: serverEnd}
	done := make(chan error, 1)
	go func() { done <- srv.run() }()

	conn, err := amqp.DialConfig("amqp://alice:s3cret@fake/vh", amqp.Config{
		Dial:       func(string, string) (net.Conn, error) { return clientEnd, nil },
		Properties: amqp.Table{"connection_name": "wire-test"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	stamp := time.Unix(1700000000, 0)
	args := amqp.Table{
		"x-delayed-type": "direct", "bool": true, "int8": int8(-1), "uint8": byte(2),
		"int16": int16(-3), "uint16": uint16(4), "int32": int32(-5), "uint32": uint32(6),
		"int64": int64(-7), "float32": float32(1.5), "float64": 2.25,
		"decimal": amqp.Decimal{Scale: 2, Value: 314}, "string": "s", "bytes": []byte{1, 2},
		"array": []any{"a", int32(1), []any{true}}, "time": stamp,
		"nested": amqp.Table{"x": "y"}, "void": nil,
	}
	if err := ch.ExchangeDeclare("delayed", "x-delayed-message", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 300000) // more than one frame
	for i := range body {
		body[i] = byte(i)
	}
	pub := amqp.Publishing{
		Headers: amqp.Table{"x-delay": int64(5000), "trace": "t1"}, ContentType: "application/octet-stream",
		ContentEncoding: "identity", DeliveryMode: amqp.Persistent, Priority: 7, CorrelationId: "c",
		ReplyTo: "r", Expiration: "60000", MessageId: "m-1", Timestamp: stamp, Type: "kind",
		UserId: "alice", AppId: "app", Body: body,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "delayed", "rk", true, false, pub)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := confirm.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("fake server: %v", err)
	}

	writeCorpus(t, "amqp091-go", srv.frames)

	byID := map[MethodID]Method{}
	for _, m := range srv.methods {
		byID[m.ID()] = m
	}
	startOk, _ := byID[IDConnectionStartOk].(*ConnectionStartOk)
	if startOk == nil || startOk.Mechanism != "PLAIN" || string(startOk.Response) != "\x00alice\x00s3cret" || startOk.Locale != "en_US" {
		t.Fatalf("start-ok: %+v", startOk)
	}
	if name, ok, err := startOk.ClientProperties.Get("connection_name"); err != nil || !ok || name != "wire-test" {
		t.Fatalf("client properties connection_name: %v %v %v", name, ok, err)
	}
	caps, _, _ := startOk.ClientProperties.Get("capabilities")
	if c, _ := decodeTable(caps.(Table)); c["publisher_confirms"] != true || c["basic.nack"] != true {
		t.Fatalf("client capabilities: %v", c)
	}
	if tune, _ := byID[IDConnectionTuneOk].(*ConnectionTuneOk); tune == nil || tune.ChannelMax != 2047 || tune.FrameMax != 131072 {
		t.Fatalf("tune-ok: %+v", tune)
	}
	if open, _ := byID[IDConnectionOpen].(*ConnectionOpen); open == nil || open.VirtualHost != "vh" {
		t.Fatalf("open: %+v", open)
	}
	decl, _ := byID[IDExchangeDeclare].(*ExchangeDeclare)
	if decl == nil || decl.Exchange != "delayed" || decl.Type != "x-delayed-message" || !decl.Durable || decl.AutoDelete || decl.NoWait {
		t.Fatalf("exchange.declare: %+v", decl)
	}
	got, err := decodeTable(decl.Arguments)
	if err != nil {
		t.Fatal(err)
	}
	nested, _ := EncodeTable(map[string]any{"x": "y"})
	want := map[string]any{
		"x-delayed-type": "direct", "bool": true, "int8": int8(-1), "uint8": uint8(2),
		"int16": int16(-3), "uint16": uint16(4), "int32": int32(-5), "uint32": uint32(6),
		"int64": int64(-7), "float32": float32(1.5), "float64": 2.25,
		"decimal": Decimal{Scale: 2, Value: 314}, "string": "s", "bytes": []byte{1, 2},
		"array": []any{"a", int32(1), []any{true}}, "time": stamp.UTC(),
		"nested": Table(nested), "void": nil,
	}
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("argument %s = %#v, want %#v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d arguments, want %d", len(got), len(want))
	}
	publish, _ := byID[IDBasicPublish].(*BasicPublish)
	if publish == nil || publish.Exchange != "delayed" || publish.RoutingKey != "rk" || !publish.Mandatory || publish.Immediate {
		t.Fatalf("basic.publish: %+v", publish)
	}
	if srv.header.ClassID != 60 || srv.header.BodySize != uint64(len(body)) || !reflect.DeepEqual(srv.body, body) {
		t.Fatalf("header %+v, %d body bytes", srv.header, len(srv.body))
	}
	p := srv.props
	if p.ContentType != pub.ContentType || p.ContentEncoding != pub.ContentEncoding || p.DeliveryMode != 2 ||
		p.Priority != 7 || p.CorrelationID != "c" || p.ReplyTo != "r" || p.Expiration != "60000" ||
		p.MessageID != "m-1" || p.Timestamp != uint64(stamp.Unix()) || p.Type != "kind" || p.UserID != "alice" || p.AppID != "app" {
		t.Fatalf("properties: %+v", p)
	}
	if d, _, err := p.Headers.Get("x-delay"); d != int64(5000) || err != nil {
		t.Fatalf("x-delay = %#v, %v", d, err)
	}
	// Our encoding of what we decoded is the client's encoding, byte for byte.
	if again := appendProperties(nil, p); !reflect.DeepEqual(again, srv.header.Properties) {
		t.Fatalf("properties re-encode:\n%x\n%x", again, srv.header.Properties)
	}
	for _, raw := range srv.frames {
		f, err := NewReader(bytes.NewReader(raw), 0).ReadFrame()
		if err != nil || f.Type != FrameMethod {
			continue
		}
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if again := AppendMethod(nil, m); !reflect.DeepEqual(again, f.Payload) {
			t.Errorf("%v re-encodes differently:\n%x\n%x", m.ID(), again, f.Payload)
		}
	}
}
