package delayproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
)

// End-to-end tests of delayed-message exchanges through the whole proxy
// (listener, interceptor, store, scheduler, releaser, admin) against the
// real RabbitMQ: every row of DESIGN.md's "Compatibility with the plugin".

// routedCase is one message of a routing test: where it is published and
// the queues (indexes) that must receive it.
type routedCase struct {
	key     string
	headers amqp.Table
	want    []int
}

// TestDelayedExchange_RoutesLikeItsType: an x-delayed-message exchange
// routes like its x-delayed-type, with bindings unchanged, and only after the
// delay; the real exchange upstream has the underlying type.
func TestDelayedExchange_RoutesLikeItsType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		typ      string
		bindings [2]struct {
			key  string
			args amqp.Table
		}
		msgs []routedCase
	}{
		{
			typ: "direct",
			bindings: [2]struct {
				key  string
				args amqp.Table
			}{{key: "a"}, {key: "b"}},
			msgs: []routedCase{{key: "a", want: []int{0}}, {key: "b", want: []int{1}}, {key: "c"}, {key: "A"}},
		},
		{
			typ: "topic",
			bindings: [2]struct {
				key  string
				args amqp.Table
			}{{key: "order.*"}, {key: "#.eu"}},
			msgs: []routedCase{
				{key: "order.us", want: []int{0}}, {key: "invoice.eu", want: []int{1}},
				{key: "order.us.ny"}, {key: "invoice.us"}, {key: "order.eu", want: []int{0, 1}},
			},
		},
		{
			typ: "fanout",
			bindings: [2]struct {
				key  string
				args amqp.Table
			}{{key: "ignored"}, {key: ""}},
			msgs: []routedCase{{key: "x", want: []int{0, 1}}, {key: "", want: []int{0, 1}}},
		},
		{
			typ: "headers",
			bindings: [2]struct {
				key  string
				args amqp.Table
			}{
				{args: amqp.Table{"x-match": "all", "region": "eu", "kind": "order"}},
				{args: amqp.Table{"x-match": "any", "region": "eu", "kind": "order"}},
			},
			msgs: []routedCase{
				{headers: amqp.Table{"region": "eu"}, want: []int{1}},
				{headers: amqp.Table{"region": "us", "kind": "invoice"}},
				{headers: amqp.Table{"region": "eu", "kind": "order"}, want: []int{0, 1}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.typ, func(t *testing.T) {
			t.Parallel()
			tp := startProxy(t, nil)
			conn := tp.dial(t)
			ch := confirmChannel(t, conn)
			ex := declareDelayed(t, ch, tt.typ, nil)

			// The real exchange upstream is a plain one of the underlying
			// type, arguments unchanged: an equivalent declare succeeds.
			bch := channel(t, dialBroker(t))
			if err := bch.ExchangeDeclare(ex, tt.typ, true, false, false, false, amqp.Table{"x-delayed-type": tt.typ}); err != nil {
				t.Fatalf("upstream exchange is not a %s exchange: %v", tt.typ, err)
			}

			var queues [2]string
			var cons [2]*consumer
			for i, b := range tt.bindings {
				queues[i] = declareQueue(t, nil)
				// Bindings go through the proxy, relayed unchanged.
				if err := ch.QueueBind(queues[i], b.key, ex, false, b.args); err != nil {
					t.Fatalf("bind: %v", err)
				}
				cons[i] = consume(t, conn, queues[i])
			}
			// Delays grow with the index: each queue gets its messages in
			// publish order.
			var want [2][]string
			sent := map[string]time.Time{}
			for i, m := range tt.msgs {
				id := fmt.Sprintf("m%d", i)
				msg := delayedMsg(int32(300+20*i), id)
				for k, v := range m.headers {
					msg.Headers[k] = v
				}
				sent[id] = time.Now()
				publishConfirmed(t, ch, ex, m.key, false, msg)
				for _, q := range m.want {
					want[q] = append(want[q], id)
				}
			}
			if got := tp.pending(t, ex); got != int64(len(tt.msgs)) {
				t.Errorf("pending after confirms = %d, want %d", got, len(tt.msgs))
			}
			// Every release is confirmed, so enqueued, before it leaves the
			// store; the consumers then get all of it before cancel-ok.
			eventually(t, 20*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
			for q := range 2 {
				got := cons[q].stop(t)
				if gotIDs := ids(got); !slices.Equal(gotIDs, want[q]) {
					t.Errorf("queue %d (binding %q %v) got %v, want %v", q, tt.bindings[q].key, tt.bindings[q].args, gotIDs, want[q])
				}
				if n := queueDepth(t, queues[q]); n != 0 {
					t.Errorf("queue %d holds %d more", q, n)
				}
				for _, a := range got {
					d := time.Duration(-a.Headers["x-delay"].(int64)) * time.Millisecond
					if early := sent[a.MessageId].Add(d).Sub(a.At); early > 0 {
						t.Errorf("%s arrived %v before its delay of %v", a.MessageId, early, d)
					}
				}
			}
		})
	}
}

func ids(as []arrival) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.MessageId
	}
	return out
}

// TestDelayedExchange_DeclareErrors: a bad x-delayed-type gets the plugin's
// code and text; an unknown type gets RabbitMQ's own answer, exactly as a
// client connected straight to RabbitMQ gets it.
func TestDelayedExchange_DeclareErrors(t *testing.T) {
	t.Parallel()
	const mustExist = "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
	tp := startProxy(t, nil)

	// What RabbitMQ itself answers for an unknown exchange type.
	direct := dialBroker(t)
	connClosed := direct.NotifyClose(make(chan *amqp.Error, 1))
	err := channel(t, direct).ExchangeDeclare(uniqueName(t, "nope"), "x-nope", false, true, false, false, nil)
	want := closeError(t, connClosed)
	if !errorIs(err, amqp.CommandInvalid, "x-nope") {
		t.Fatalf("RabbitMQ answered an unknown type with %v; the test expects 503 COMMAND_INVALID", err)
	}

	tests := []struct {
		name      string
		args      amqp.Table
		code      int
		reason    string
		connLevel bool
	}{
		{name: "missing", args: nil, code: amqp.PreconditionFailed, reason: mustExist},
		{name: "empty", args: amqp.Table{"x-delayed-type": ""}, code: amqp.PreconditionFailed, reason: mustExist},
		{name: "integer", args: amqp.Table{"x-delayed-type": int32(1)}, code: amqp.PreconditionFailed, reason: mustExist},
		{name: "table", args: amqp.Table{"x-delayed-type": amqp.Table{"direct": true}}, code: amqp.PreconditionFailed, reason: mustExist},
		{name: "itself", args: amqp.Table{"x-delayed-type": "x-delayed-message"}, code: amqp.PreconditionFailed,
			reason: "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"},
		{name: "unknown type", args: amqp.Table{"x-delayed-type": "x-nope"}, code: want.Code, reason: want.Reason, connLevel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := tp.dial(t)
			connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
			ch := channel(t, conn)
			chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
			name := uniqueName(t, "x")
			err := ch.ExchangeDeclare(name, "x-delayed-message", true, false, false, false, tt.args)
			if !errorIs(err, tt.code, tt.reason) || err.(*amqp.Error).Reason != tt.reason {
				t.Fatalf("declare = %v, want %d %q", err, tt.code, tt.reason)
			}
			closeError(t, chClosed)
			if tt.connLevel {
				if e := closeError(t, connClosed); e.Code != tt.code {
					t.Errorf("connection closed with %v, want %d", e, tt.code)
				}
			} else if conn.IsClosed() {
				t.Error("a channel error closed the connection")
			} else {
				// The connection still works.
				if _, err := channel(t, conn).QueueDeclare("", false, true, true, false, nil); err != nil {
					t.Errorf("connection unusable after the channel error: %v", err)
				}
			}
			if code, body := tp.httpDo(t, http.MethodGet, exchangePath(name)); code != http.StatusNotFound {
				t.Errorf("refused exchange is in the registry: %d %s", code, body)
			}
			bch := channel(t, dialBroker(t))
			if err := bch.ExchangeDeclarePassive(name, "direct", true, false, false, false, nil); !errorIs(err, amqp.NotFound, "") {
				t.Errorf("refused exchange exists upstream: %v", err)
				bch2 := channel(t, dialBroker(t))
				bch2.ExchangeDelete(name, false, false)
			}
		})
	}
}

// TestDelayedExchange_Redeclare: passive declares work on a delayed
// exchange; redeclaring with the same arguments keeps pending messages;
// different arguments get RabbitMQ's 406 and change nothing.
func TestDelayedExchange_Redeclare(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	conn := tp.dial(t)
	ch := confirmChannel(t, conn)
	ex := declareDelayed(t, ch, "direct", amqp.Table{"note": "v1"})
	q := declareQueue(t, nil)
	bind(t, q, "k", ex, nil)
	cons := consume(t, dialBroker(t), q)

	start := time.Now()
	publishConfirmed(t, ch, ex, "k", false, delayedMsg(int32(1500), "before"))

	if err := ch.ExchangeDeclarePassive(ex, "x-delayed-message", true, false, false, false, nil); err != nil {
		t.Fatalf("passive declare of a delayed exchange: %v", err)
	}
	if err := ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false,
		amqp.Table{"x-delayed-type": "direct", "note": "v1"}); err != nil {
		t.Fatalf("redeclare with the same arguments: %v", err)
	}
	if n := tp.pending(t, ex); n != 1 {
		t.Fatalf("pending after an equivalent redeclare = %d, want 1", n)
	}

	inequivalent := []struct {
		name    string
		durable bool
		args    amqp.Table
		reason  string
	}{
		{"other type", true, amqp.Table{"x-delayed-type": "topic", "note": "v1"}, "inequivalent arg 'x-delayed-type'"},
		{"not durable", false, amqp.Table{"x-delayed-type": "direct", "note": "v1"}, "inequivalent arg 'durable'"},
		{"alternate exchange", true, amqp.Table{"x-delayed-type": "direct", "note": "v1", "alternate-exchange": "ae"}, "inequivalent arg 'alternate-exchange'"},
	}
	for _, tt := range inequivalent {
		ch2 := channel(t, conn)
		err := ch2.ExchangeDeclare(ex, "x-delayed-message", tt.durable, false, false, false, tt.args)
		if !errorIs(err, amqp.PreconditionFailed, tt.reason) {
			t.Errorf("%s: redeclare = %v, want 406 %q", tt.name, err, tt.reason)
		}
	}
	// Passive declares of a missing exchange: RabbitMQ's 404.
	ch3 := channel(t, conn)
	if err := ch3.ExchangeDeclarePassive(uniqueName(t, "missing"), "x-delayed-message", true, false, false, false, nil); !errorIs(err, amqp.NotFound, "no exchange") {
		t.Errorf("passive declare of a missing exchange = %v, want 404", err)
	}

	// Nothing changed: the exchange is still delayed and direct.
	publishConfirmed(t, ch, ex, "k", false, delayedMsg(int32(300), "after"))
	publishConfirmed(t, ch, ex, "other-key", false, delayedMsg(int32(300), "unroutable"))
	got := cons.wait(t, 2, 20*time.Second)
	if !slices.Equal(ids(got), []string{"after", "before"}) {
		t.Fatalf("arrived %v, want [after before]", ids(got))
	}
	if early := start.Add(1500 * time.Millisecond).Sub(got[1].At); early > 0 {
		t.Errorf("message published before the redeclare arrived %v early", early)
	}
}

// TestDelayedExchange_NoWaitDeclareThenPublish: a publish sent right after a
// no-wait declare, without waiting for anything, is still delayed.
func TestDelayedExchange_NoWaitDeclareThenPublish(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	conn := tp.dial(t)
	ch := channel(t, conn)
	ex := uniqueName(t, "x")
	t.Cleanup(func() { brokerCleanup(t, func(ch *amqp.Channel) error { return ch.ExchangeDelete(ex, false, false) }) })
	start := time.Now()
	if err := ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, true, amqp.Table{"x-delayed-type": "fanout"}); err != nil {
		t.Fatal(err)
	}
	publish(t, ch, ex, "", delayedMsg("800", "nowait"))
	// The binding comes after the publish: the message is routed at release.
	q := declareQueue(t, nil)
	if err := ch.QueueBind(q, "", ex, false, nil); err != nil {
		t.Fatalf("bind after the no-wait declare: %v", err)
	}
	cons := consume(t, conn, q)
	got := cons.wait(t, 1, 20*time.Second)
	if early := start.Add(800 * time.Millisecond).Sub(got[0].At); early > 0 {
		t.Fatalf("arrived %v before its delay", early)
	}
	if got[0].Headers["x-delay"] != int64(-800) {
		t.Errorf("x-delay on release = %#v, want int64(-800)", got[0].Headers["x-delay"])
	}
}

// TestXDelay_Types: x-delay as any integer width, a numeric string or a
// float is held for that many milliseconds (floats truncated), and comes
// back as x-delay = -delay (a signed long).
func TestXDelay_Types(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		value any
		ms    int64
	}{
		{"int8", int8(120), 120},
		{"uint8", uint8(250), 250},
		{"int16", int16(310), 310},
		{"uint16", uint16(320), 320},
		{"int32", int32(330), 330},
		{"int", 340, 340},
		{"uint32", uint32(350), 350},
		{"int64", int64(360), 360},
		{"numeric string", "370", 370},
		{"float string", "380.9", 380},
		{"byte array", []byte("390"), 390},
		{"float32", float32(400.75), 400},
		{"float64", 410.99, 410},
		{"decimal", amqp.Decimal{Scale: 2, Value: 42099}, 420},
	}
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex, _, cons := delayedFanout(t, ch)
	sent := map[string]time.Time{}
	for _, tt := range tests {
		sent[tt.name] = time.Now()
		publishConfirmed(t, ch, ex, "", false, delayedMsg(tt.value, tt.name))
	}
	got := map[string]arrival{}
	for _, a := range cons.wait(t, len(tests), 20*time.Second) {
		got[a.MessageId] = a
	}
	for _, tt := range tests {
		a, ok := got[tt.name]
		if !ok {
			t.Errorf("%s: never arrived", tt.name)
			continue
		}
		if a.Headers["x-delay"] != -tt.ms {
			t.Errorf("%s: x-delay on release = %#v (%T), want int64(%d)", tt.name, a.Headers["x-delay"], a.Headers["x-delay"], -tt.ms)
		}
		if early := sent[tt.name].Add(time.Duration(tt.ms) * time.Millisecond).Sub(a.At); early > 0 {
			t.Errorf("%s: arrived %v before its delay of %d ms", tt.name, early, tt.ms)
		}
	}
}

// TestXDelay_RoutedAtOnce: x-delay zero, negative, below one millisecond or
// missing is routed at once, never stored, with the header as it was.
func TestXDelay_RoutedAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		headers amqp.Table
	}{
		{"missing", nil},
		{"other headers only", amqp.Table{"a": "b"}},
		{"zero", amqp.Table{"x-delay": int32(0)}},
		{"negative", amqp.Table{"x-delay": int64(-5000)}},
		{"negative string", amqp.Table{"x-delay": "-100"}},
		{"below one ms", amqp.Table{"x-delay": 0.9}},
	}
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex, _, cons := delayedFanout(t, ch)
	for _, tt := range tests {
		publishConfirmed(t, ch, ex, "", false, amqp.Publishing{Headers: tt.headers, MessageId: tt.name})
	}
	// A held message after them: once it is confirmed, everything before it
	// has been decided.
	publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(3_600_000), "held"))
	got := map[string]arrival{}
	for _, a := range cons.wait(t, len(tests), 20*time.Second) {
		got[a.MessageId] = a
	}
	for _, tt := range tests {
		a, ok := got[tt.name]
		if !ok {
			t.Errorf("%s: never arrived", tt.name)
			continue
		}
		want := tt.headers
		if want == nil {
			want = amqp.Table{}
		}
		if gotH := a.Headers; !reflect.DeepEqual(map[string]any(gotH), map[string]any(want)) && !(len(gotH) == 0 && len(want) == 0) {
			t.Errorf("%s: headers = %#v, want %#v unchanged", tt.name, gotH, want)
		}
	}
	if n := tp.pending(t, ex); n != 1 {
		t.Errorf("pending = %d, want only the held message", n)
	}
	if n := tp.metric(t, "delayproxy_messages_stored_total"); n != 1 {
		t.Errorf("messages_stored_total = %v, want 1", n)
	}
}

// TestXDelay_Refused: an x-delay that is not a number, or above
// --max-delay, closes the channel with 406 naming the header, as does a body
// above --max-message-size; nothing is stored and the connection stays
// usable.
func TestXDelay_Refused(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, func(c *Config) { c.MaxDelay, c.MaxMessageSize = time.Hour, 1024 })
	conn := tp.dial(t)
	ex := declareDelayed(t, channel(t, conn), "fanout", nil)
	tests := []struct {
		name   string
		value  any
		body   int // bytes; 0: a short body
		reason string
		metric string
	}{
		{"not a number", "abc", 0, "x-delay", `delayproxy_messages_refused_total{reason="invalid_delay"}`},
		{"above max-delay", int64(2 * time.Hour / time.Millisecond), 0, "x-delay 7200000 ms is larger than the maximum delay 3600000 ms", `delayproxy_messages_refused_total{reason="delay_too_long"}`},
		{"above max-message-size", 1000, 1025, "message size 1025 is larger than configured max size 1024", `delayproxy_messages_refused_total{reason="too_large"}`},
	}
	for _, tt := range tests {
		for _, confirm := range []bool{false, true} {
			ch := channel(t, conn)
			if confirm {
				if err := ch.Confirm(false); err != nil {
					t.Fatal(err)
				}
			}
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			m := delayedMsg(tt.value, tt.name)
			if tt.body > 0 {
				m.Body = make([]byte, tt.body)
			}
			publish(t, ch, ex, "", m)
			e := closeError(t, closed)
			if e.Code != amqp.PreconditionFailed || !strings.HasPrefix(e.Reason, "PRECONDITION_FAILED - ") || !strings.Contains(e.Reason, tt.reason) {
				t.Errorf("%s (confirm %v): channel closed with %d %q, want 406 containing %q", tt.name, confirm, e.Code, e.Reason, tt.reason)
			}
		}
		if n := tp.metric(t, tt.metric); n != 2 {
			t.Errorf("%s = %v, want 2", tt.metric, n)
		}
	}
	if conn.IsClosed() {
		t.Fatal("a refused x-delay closed the connection")
	}
	if n := tp.pending(t, ex); n != 0 {
		t.Errorf("pending = %d after refused publishes", n)
	}
}

// TestXDelay_BeyondUint32IsHeld: unlike the plugin, which routed them at
// once, delays above 2^32-1 ms are held; the admin API counts and cancels
// them.
func TestXDelay_BeyondUint32IsHeld(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex := declareDelayed(t, ch, "fanout", nil)
	q := declareQueue(t, nil)
	bind(t, q, "", ex, nil)
	publishConfirmed(t, ch, ex, "", false, delayedMsg(int64(math.MaxUint32)+1, "far"))
	publishConfirmed(t, ch, ex, "", false, delayedMsg(uint32(math.MaxUint32), "edge"))
	if n := tp.pending(t, ex); n != 2 {
		t.Fatalf("pending = %d, want 2 held", n)
	}
	list := tp.listPending(t, ex)
	delays := map[string]int64{}
	for _, m := range list {
		delays[m.MessageID] = m.DelayMs
	}
	if len(list) != 2 || delays["far"] != math.MaxUint32+1 || delays["edge"] != math.MaxUint32 {
		t.Fatalf("pending list = %+v", list)
	}
	for _, id := range []string{"far", "edge"} {
		code, body := tp.httpDo(t, http.MethodDelete, exchangePath(ex)+"/messages/"+id)
		var res struct {
			Cancelled int `json:"cancelled"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &res) != nil || res.Cancelled != 1 {
			t.Fatalf("cancel %s: %d %s", id, code, body)
		}
	}
	if n := tp.pending(t, ex); n != 0 {
		t.Fatalf("pending after cancel = %d", n)
	}
	if n := queueDepth(t, q); n != 0 {
		t.Fatalf("a held message reached the queue (%d)", n)
	}
}

// TestRelease_MessageUnchanged: the released message has the original
// routing key, properties and body; only x-delay becomes -delay.
func TestRelease_MessageUnchanged(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex := declareDelayed(t, ch, "direct", nil)
	q := declareQueue(t, nil)
	bind(t, q, "route.me", ex, nil)
	cons := consume(t, dialBroker(t), q)
	ts := time.Unix(time.Now().Unix()-3600, 0)
	body := bytes.Repeat([]byte{0, 1, 2, 0xff, 'x'}, 1000) // several frames' worth at small frame_max
	headers := amqp.Table{
		"x-delay":  int32(250),
		"string":   "s",
		"int32":    int32(-7),
		"int64":    int64(1) << 40,
		"bool":     true,
		"float64":  1.5,
		"bytes":    []byte{1, 2, 3},
		"nested":   amqp.Table{"k": "v", "n": int32(1)},
		"array":    []any{"a", int32(2)},
		"time":     ts,
		"decimal":  amqp.Decimal{Scale: 3, Value: 12345},
		"x-custom": "kept",
	}
	pub := amqp.Publishing{
		Headers:         headers,
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "corr-1",
		ReplyTo:         "reply.here",
		Expiration:      "600000",
		MessageId:       "msg-1",
		Timestamp:       ts,
		Type:            "order.created",
		UserId:          "guest",
		AppId:           "e2e",
		Body:            body,
	}
	publishConfirmed(t, ch, ex, "route.me", false, pub)
	d := cons.wait(t, 1, 20*time.Second)[0]

	if d.Exchange != ex || d.RoutingKey != "route.me" {
		t.Errorf("exchange/key = %s/%s", d.Exchange, d.RoutingKey)
	}
	if !bytes.Equal(d.Body, body) {
		t.Errorf("body changed: %d bytes, want %d", len(d.Body), len(body))
	}
	gotProps := [...]any{d.ContentType, d.ContentEncoding, d.DeliveryMode, d.Priority, d.CorrelationId, d.ReplyTo,
		d.Expiration, d.MessageId, d.Timestamp.Unix(), d.Type, d.UserId, d.AppId}
	wantProps := [...]any{pub.ContentType, pub.ContentEncoding, pub.DeliveryMode, pub.Priority, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Timestamp.Unix(), pub.Type, pub.UserId, pub.AppId}
	if gotProps != wantProps {
		t.Errorf("properties = %v, want %v", gotProps, wantProps)
	}
	wantHeaders := amqp.Table{}
	for k, v := range headers {
		wantHeaders[k] = v
	}
	wantHeaders["x-delay"] = int64(-250)
	for k, want := range wantHeaders {
		got := d.Headers[k]
		if tm, ok := want.(time.Time); ok {
			if gt, ok := got.(time.Time); !ok || !gt.Equal(tm) {
				t.Errorf("header %s = %#v, want %v", k, got, tm)
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("header %s = %#v (%T), want %#v (%T)", k, got, got, want, want)
		}
	}
	if len(d.Headers) != len(wantHeaders) {
		t.Errorf("headers = %v, want %v", d.Headers, wantHeaders)
	}
}

// TestConfirm_AfterStore: the publisher's ack comes only once the message is
// stored (the admin API counts it at that moment); channels without
// confirm mode are delayed too.
func TestConfirm_AfterStore(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	conn := tp.dial(t)
	ch := confirmChannel(t, conn)
	ex, _, cons := delayedFanout(t, ch)

	for i := range 20 {
		publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(3_600_000), fmt.Sprint("c", i)))
		if n := tp.pending(t, ex); n != int64(i+1) {
			t.Fatalf("after ack %d the admin API counts %d pending", i+1, n)
		}
	}
	// Without confirm mode.
	plain := channel(t, conn)
	start := time.Now()
	publish(t, plain, ex, "", delayedMsg(int32(400), "plain"))
	eventually(t, 10*time.Second, "the unconfirmed publish to be stored", func() bool { return tp.pending(t, ex) == 21 })
	got := cons.wait(t, 1, 20*time.Second)
	if got[0].MessageId != "plain" || got[0].At.Before(start.Add(400*time.Millisecond)) {
		t.Fatalf("got %s at +%v", got[0].MessageId, got[0].At.Sub(start))
	}
	if n := tp.metric(t, "delayproxy_messages_stored_total"); n != 21 {
		t.Errorf("messages_stored_total = %v, want 21", n)
	}
}

// TestTx_StoredAtCommit: in a transaction, delayed publishes are stored at
// tx.commit and dropped at tx.rollback.
func TestTx_StoredAtCommit(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	conn := tp.dial(t)
	ch := channel(t, conn)
	ex, q, cons := delayedFanout(t, ch)
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	roundTrip := func() { // the proxy has read everything sent before it
		t.Helper()
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}

	publish(t, ch, ex, "", delayedMsg(int32(1500), "rolled-back"))
	roundTrip()
	if n := tp.pending(t, ex); n != 0 {
		t.Fatalf("pending before commit = %d", n)
	}
	if err := ch.TxRollback(); err != nil {
		t.Fatal(err)
	}
	if n := tp.pending(t, ex); n != 0 {
		t.Fatalf("pending after rollback = %d", n)
	}

	start := time.Now()
	publish(t, ch, ex, "", delayedMsg(int32(1000), "committed-1"))
	publish(t, ch, ex, "", delayedMsg(int32(1100), "committed-2"))
	publish(t, ch, ex, "", amqp.Publishing{MessageId: "not-delayed"}) // relayed, committed by RabbitMQ
	roundTrip()
	if n := tp.pending(t, ex); n != 0 {
		t.Fatalf("pending before commit = %d", n)
	}
	if n := queueDepth(t, q) + len(cons.snapshot()); n != 0 {
		t.Fatalf("an uncommitted publish reached the queue")
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	if n := tp.pending(t, ex); n != 2 {
		t.Fatalf("pending right after commit-ok = %d, want 2", n)
	}
	// An empty commit after a rollback changes nothing.
	publish(t, ch, ex, "", delayedMsg(int32(500), "rolled-back-2"))
	if err := ch.TxRollback(); err != nil {
		t.Fatal(err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	got := cons.wait(t, 3, 20*time.Second)
	if !slices.Equal(ids(got), []string{"not-delayed", "committed-1", "committed-2"}) {
		t.Fatalf("arrived %v", ids(got))
	}
	if got[1].At.Before(start.Add(time.Second)) {
		t.Errorf("committed message arrived early")
	}
	eventually(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
	if n := queueDepth(t, q) + len(cons.snapshot()); n != 3 {
		t.Fatalf("%d messages reached the queue, want 3 (no rolled-back one)", n)
	}
}

// TestMandatory_NoReturnAtPublish: a mandatory publish to a delayed exchange
// without bindings is confirmed and not returned; at release RabbitMQ
// returns it to the proxy, which counts it.
func TestMandatory_NoReturnAtPublish(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	returns := ch.NotifyReturn(make(chan amqp.Return, 10))
	ex := declareDelayed(t, ch, "direct", nil)
	publishConfirmed(t, ch, ex, "nowhere", true, delayedMsg(int32(300), "m"))
	eventually(t, 20*time.Second, "the unroutable counter to move", func() bool {
		return tp.metric(t, "delayproxy_messages_unroutable_total") == 1
	})
	// RabbitMQ confirms a returned message too: it leaves the store.
	eventually(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
	if n := tp.metric(t, "delayproxy_messages_released_total"); n != 1 {
		t.Errorf("messages_released_total = %v, want 1", n)
	}
	// A relayed publish on the same channel is returned as usual, so returns
	// reach this client: the delayed one was not.
	if err := ch.PublishWithContext(context.Background(), "", uniqueName(t, "noqueue"), true, false, amqp.Publishing{MessageId: "plain"}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-returns:
		if r.MessageId != "plain" {
			t.Fatalf("basic.return for %q, want only the plain publish", r.MessageId)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no basic.return for the relayed unroutable publish")
	}
	select {
	case r := <-returns:
		t.Fatalf("unexpected basic.return %+v", r)
	default:
	}
}

// TestAlternateExchange_AtRelease: the delayed exchange's alternate-exchange
// gets unroutable messages at release time, not at publish.
func TestAlternateExchange_AtRelease(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ae := declarePlainExchange(t, "fanout")
	aeQueue := declareQueue(t, nil)
	bind(t, aeQueue, "", ae, nil)
	ex := declareDelayed(t, ch, "direct", amqp.Table{"alternate-exchange": ae})
	bound := declareQueue(t, nil)
	bind(t, bound, "k", ex, nil)
	aeCons := consume(t, dialBroker(t), aeQueue)
	boundCons := consume(t, dialBroker(t), bound)

	start := time.Now()
	publishConfirmed(t, ch, ex, "unbound", true, delayedMsg(int32(700), "to-ae"))
	publishConfirmed(t, ch, ex, "k", true, delayedMsg(int32(700), "routed"))
	if got := aeCons.snapshot(); len(got) != 0 {
		t.Fatalf("alternate exchange got %v at publish", ids(got))
	}
	a := aeCons.wait(t, 1, 20*time.Second)[0]
	if a.MessageId != "to-ae" || a.At.Before(start.Add(700*time.Millisecond)) {
		t.Fatalf("alternate exchange got %s at +%v, want to-ae after 700ms", a.MessageId, a.At.Sub(start))
	}
	if b := boundCons.wait(t, 1, 20*time.Second)[0]; b.MessageId != "routed" {
		t.Fatalf("bound queue got %s", b.MessageId)
	}
	eventually(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
	if n := tp.metric(t, "delayproxy_messages_unroutable_total"); n != 0 {
		t.Errorf("unroutable = %v: the alternate exchange took it", n)
	}
}

// TestExchangeDelete_DiscardsPending: deleting a delayed exchange discards
// its pending messages (counted), and a re-created exchange of the same name
// never gets them.
func TestExchangeDelete_DiscardsPending(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	conn := tp.dial(t)
	ch := confirmChannel(t, conn)
	ex, q, cons := delayedFanout(t, ch)
	for i := range 5 {
		publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(600), fmt.Sprint("old", i)))
	}
	if err := ch.ExchangeDelete(ex, false, false); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if n := tp.metric(t, "delayproxy_messages_discarded_total"); n != 5 {
		t.Errorf("messages_discarded_total = %v, want 5", n)
	}
	if code, _ := tp.httpDo(t, http.MethodGet, exchangePath(ex)); code != http.StatusNotFound {
		t.Errorf("deleted exchange still in the registry (%d)", code)
	}
	// Re-create it with the same name and bind again: the old messages are
	// due before the new one, so when the new one arrives they would have.
	if err := ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "fanout"}); err != nil {
		t.Fatal(err)
	}
	bind(t, q, "", ex, nil)
	publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(900), "new"))
	got := cons.wait(t, 1, 20*time.Second)
	eventually(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
	if all := append(ids(got), ids(cons.snapshot()[len(got):])...); !slices.Equal(all, []string{"new"}) {
		t.Fatalf("arrived %v, want only [new]", all)
	}
	if n := queueDepth(t, q); n != 0 {
		t.Fatalf("%d more messages in the queue", n)
	}
	// The scheduler has met the stale messages by now (they were due before
	// the new one): they are not counted twice.
	if n := tp.metric(t, "delayproxy_messages_discarded_total"); n != 5 {
		t.Errorf("messages_discarded_total = %v after the release, want 5", n)
	}
}

// TestRelease_MixedDelaysInDueOrder: a few hundred messages with delays
// over 0-3 s arrive in due order and none early, measured on the client.
func TestRelease_MixedDelaysInDueOrder(t *testing.T) {
	t.Parallel()
	const n = 400
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex, _, cons := delayedFanout(t, ch)

	type sent struct {
		delay     time.Duration
		before    time.Time // just before the publish
		confirmed time.Time // when its ack arrived
	}
	msgs := make([]sent, n)
	confirms := make(chan *amqp.DeferredConfirmation, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			dc := <-confirms
			if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
				t.Errorf("publish %d: ack=%v err=%v", i, ok, err)
			}
			msgs[i].confirmed = time.Now()
		}
	})
	for i := range n {
		// A spread of delays over 0-3 s, shuffled against publish order.
		ms := int32((i * 7919) % 3000)
		msgs[i].delay = time.Duration(ms) * time.Millisecond
		msgs[i].before = time.Now()
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "", false, false, delayedMsg(ms, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		confirms <- dc
	}
	wg.Wait()
	got := cons.wait(t, n, 30*time.Second)

	var late []time.Duration
	fmtID := func(a arrival) int {
		i, err := strconv.Atoi(a.MessageId)
		if err != nil {
			t.Fatalf("message id %q", a.MessageId)
		}
		return i
	}
	for k, a := range got {
		m := msgs[fmtID(a)]
		due := m.before.Add(m.delay)
		if a.At.Before(due) {
			t.Errorf("message %s (delay %v) arrived %v early", a.MessageId, m.delay, due.Sub(a.At))
		}
		late = append(late, a.At.Sub(due))
		if k == 0 {
			continue
		}
		// Release order is due order. The proxy's due time is its clock
		// when it read the publish (between the publish and its ack),
		// rounded up to the millisecond, plus the delay; so an inversion is
		// certain only when the earlier arrival was due after the later
		// one could have been.
		p := msgs[fmtID(got[k-1])]
		if p.before.Add(p.delay).After(m.confirmed.Add(m.delay + time.Millisecond)) {
			t.Errorf("message %s (delay %v) arrived before %s (delay %v), which was due earlier",
				got[k-1].MessageId, p.delay, a.MessageId, m.delay)
		}
	}
	slices.Sort(late)
	t.Logf("%d messages, delays 0-3 s: lateness (arrival - publish - delay, client clock) min %v, p50 %v, p99 %v, max %v",
		n, late[0], percentile(late, 0.5), percentile(late, 0.99), late[len(late)-1])
}

// TestRestart_ExactlyOnce: stopped gracefully with messages pending and
// started again on the same data dir, the proxy delivers every message
// exactly once.
func TestRestart_ExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 300
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex := declareDelayed(t, ch, "fanout", nil)
	q := declareQueue(t, nil)
	bind(t, q, "", ex, nil)
	for i := range n {
		// Spread over 0.1-2.5 s: some are released before the stop,
		// some while it stops, the rest after the restart.
		ms := int32(100 + (i*7919)%2400)
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "", false, false, delayedMsg(ms, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		if i == n-1 {
			if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
				t.Fatalf("last publish: %v %v", ok, err)
			}
		}
	}
	eventually(t, 10*time.Second, "some releases before the stop", func() bool { return queueDepth(t, q) > 0 })
	before := tp.pending(t, ex)
	tp.restart()
	if before == 0 {
		t.Fatal("nothing was pending at the stop")
	}
	eventually(t, 30*time.Second, "every message to be released", func() bool { return tp.pending(t, ex) == 0 })
	// Every release is confirmed (so enqueued) before it leaves the store.
	got := drain(t, q)
	count := map[string]int{}
	for _, d := range got {
		count[d.MessageId]++
	}
	for i := range n {
		if c := count[fmt.Sprint(i)]; c != 1 {
			t.Errorf("message %d arrived %d times", i, c)
		}
	}
	if len(got) != n {
		t.Errorf("%d deliveries, want %d", len(got), n)
	}
	t.Logf("%d of %d were pending at the stop", before, n)
}

// TestRelease_QuorumAndClassicQueues: releases reach quorum and classic
// queues alike.
func TestRelease_QuorumAndClassicQueues(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	ch := confirmChannel(t, tp.dial(t))
	ex := declareDelayed(t, ch, "fanout", nil)
	quorum := declareQueue(t, amqp.Table{"x-queue-type": "quorum"})
	classic := declareQueue(t, amqp.Table{"x-queue-type": "classic"})
	bind(t, quorum, "", ex, nil)
	bind(t, classic, "", ex, nil)
	qc, cc := consume(t, dialBroker(t), quorum), consume(t, dialBroker(t), classic)
	for i := range 10 {
		publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(200+10*i), fmt.Sprint(i)))
	}
	want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	if got := ids(qc.wait(t, 10, 20*time.Second)); !slices.Equal(got, want) {
		t.Errorf("quorum queue got %v", got)
	}
	if got := ids(cc.wait(t, 10, 20*time.Second)); !slices.Equal(got, want) {
		t.Errorf("classic queue got %v", got)
	}
}

// TestDelayed_PublisherAndConsumerThroughProxy: both sides of the delayed
// path connected through the proxy, on one connection and on two.
func TestDelayed_PublisherAndConsumerThroughProxy(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	pubConn := tp.dial(t)
	ch := confirmChannel(t, pubConn)
	ex := declareDelayed(t, ch, "topic", nil)
	q1, err := ch.QueueDeclare(uniqueName(t, "q"), false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		brokerCleanup(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q1.Name, false, false, false); return err })
	})
	q2 := declareQueue(t, nil)
	if err := ch.QueueBind(q1.Name, "a.#", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q2, "#.b", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	same := consume(t, pubConn, q1.Name) // the publisher's own connection
	other := consume(t, tp.dial(t), q2)  // another proxied connection
	start := time.Now()
	publishConfirmed(t, ch, ex, "a.b", false, delayedMsg(int32(500), "both"))
	publishConfirmed(t, ch, ex, "a.x", false, delayedMsg(int32(400), "a-only"))
	if got := ids(same.wait(t, 2, 20*time.Second)); !slices.Equal(got, []string{"a-only", "both"}) {
		t.Errorf("same connection got %v", got)
	}
	got := other.wait(t, 1, 20*time.Second)
	if got[0].MessageId != "both" || got[0].At.Before(start.Add(500*time.Millisecond)) {
		t.Errorf("other connection got %s at +%v", got[0].MessageId, got[0].At.Sub(start))
	}
}

// TestRelease_BurstSameMillisecondByPriority: messages all due at the same
// millisecond, with priorities 0-9, arrive highest priority first and in
// publish order within a priority (a plain classic queue keeps arrival
// order). 20,000 here; the 100,000 version is TestFaultBurst100k (build tag
// brokerfaults), since it takes over a minute with -race.
func TestRelease_BurstSameMillisecondByPriority(t *testing.T) {
	t.Parallel()
	testBurst(t, 20_000)
}

// testBurst publishes n messages through the proxy that are all due at one
// millisecond, and checks their release order.
//
// The proxy computes due = its clock + x-delay when it reads a publish, so a
// client cannot give thousands of publishes one due millisecond on its own:
// the proxy's clock is frozen while they are sent, with x-delay one hour.
// Four publishers send them in one transaction each. Then the clock jumps
// forward to just before the due time: the scheduler loads them from disk
// into one wheel slot, which fires with all of them in it, however long
// publishing took.
func testBurst(t *testing.T, n int) {
	const (
		publishers = 4
		delay      = time.Hour
	)
	clock := &testClock{}
	tp := startProxyClock(t, nil, clock)
	var chans [publishers]*amqp.Channel
	for p := range chans {
		chans[p] = channel(t, tp.dial(t))
		if err := chans[p].Tx(); err != nil {
			t.Fatal(err)
		}
	}
	ex := declareDelayed(t, chans[0], "direct", nil)
	q := declareQueue(t, nil) // classic, no x-max-priority: arrival order is kept
	bind(t, q, "k", ex, nil)
	cons := consume(t, dialBroker(t), q)

	frozen := clock.freeze()
	due := time.UnixMilli(delayed.DueAt(frozen, delay.Milliseconds()))
	began := time.Now()
	var wg sync.WaitGroup
	for p, ch := range chans {
		wg.Go(func() {
			for i := range n / publishers {
				prio := (i*7 + p) % 10
				err := ch.PublishWithContext(context.Background(), ex, "k", false, false, amqp.Publishing{
					Headers:   amqp.Table{"x-delay": int64(delay / time.Millisecond)},
					Priority:  uint8(prio),
					MessageId: fmt.Sprintf("%d/%d/%d", prio, p, i),
				})
				if err != nil {
					t.Errorf("publisher %d: %v", p, err)
					return
				}
			}
			if err := ch.TxCommit(); err != nil {
				t.Errorf("publisher %d: tx.commit: %v", p, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	n = n / publishers * publishers
	published := time.Since(began)
	clock.set(frozen.Add(published)) // running again, an hour before the due time
	t.Logf("published and committed %d messages in %v (%.0f msg/s)", n, published, float64(n)/published.Seconds())
	list := tp.listPending(t, ex)
	if len(list) != n {
		t.Fatalf("%d pending, want %d", len(list), n)
	}
	for _, m := range list {
		if m.DueMs != due.UnixMilli() {
			t.Fatalf("message %s is due at %d, want all at %d", m.MessageID, m.DueMs, due.UnixMilli())
		}
	}
	if got := cons.snapshot(); len(got) > 0 {
		t.Fatalf("%d messages arrived an hour early", len(got))
	}

	clock.set(due.Add(-300 * time.Millisecond))
	got := cons.wait(t, n, 90*time.Second)
	if first := clock.at(got[0].At); first.Before(due) {
		t.Errorf("first message arrived %v before the due time", due.Sub(first))
	}
	// Highest priority first. Within a priority, publish order: each
	// publisher's messages in order, and the publishers one after the other
	// (a commit's messages are stored together).
	prevPrio, prevPub := 10, -1
	lastSeq := map[[2]int]int{}
	done := map[[2]int]bool{} // (priority, publisher) groups already passed
	for i, a := range got {
		var prio, pub, seq int
		if _, err := fmt.Sscanf(a.MessageId, "%d/%d/%d", &prio, &pub, &seq); err != nil {
			t.Fatalf("message id %q: %v", a.MessageId, err)
		}
		g := [2]int{prio, pub}
		switch {
		case prio > prevPrio:
			t.Fatalf("arrival %d: priority %d after priority %d", i, prio, prevPrio)
		case done[g]:
			t.Fatalf("arrival %d: publisher %d's priority %d messages are interleaved with another's", i, pub, prio)
		}
		if last, ok := lastSeq[g]; ok && seq <= last {
			t.Fatalf("arrival %d: publisher %d's message %d (priority %d) after its message %d", i, pub, seq, prio, last)
		}
		if prevPub >= 0 && (prio != prevPrio || pub != prevPub) {
			done[[2]int{prevPrio, prevPub}] = true
		}
		lastSeq[g] = seq
		prevPrio, prevPub = prio, pub
	}
	// Exactly the store's release order, as the admin API listed it.
	for i, m := range list {
		if got[i].MessageId != m.MessageID {
			t.Fatalf("arrival %d is %s, the store's release order has %s", i, got[i].MessageId, m.MessageID)
		}
	}
	eventually(t, 30*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
	if rest := cons.stop(t); len(rest) != n {
		t.Fatalf("%d deliveries, want %d", len(rest), n)
	}
	releasedIn := clock.at(got[len(got)-1].At).Sub(due)
	t.Logf("all %d arrived within %v of the due time (%.0f msg/s); the first %v after it",
		n, releasedIn, float64(n)/releasedIn.Seconds(), clock.at(got[0].At).Sub(due))
}
