package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// Publishing to delayed exchanges through the proxy: the x-delay header's
// types and limits, and the answers a publisher gets (confirms,
// transactions, mandatory).

// TestXDelay_Types: x-delay as any integer width, a numeric string or a
// float is held for that many milliseconds (floats truncated), and comes
// back as x-delay = -delay (a signed long).
func TestXDelay_Types(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
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
		_, ch := startConfirmedOn(t, b)
		ex, _, cons := delayedFanoutOn(t, b, ch)
		sent := map[string]time.Time{}
		for _, tt := range tests {
			sent[tt.name] = time.Now()
			publishConfirmed(t, ch, ex, "", false, delayedMsg(tt.value, tt.name))
		}
		got := cons.waitByID(t, len(tests), 20*time.Second)
		for _, tt := range tests {
			if a, ok := arrived(t, got, tt.name); ok {
				if a.Headers["x-delay"] != -tt.ms {
					t.Errorf("%s: x-delay on release = %#v (%T), want int64(%d)", tt.name, a.Headers["x-delay"], a.Headers["x-delay"], -tt.ms)
				}
				if early := sent[tt.name].Add(time.Duration(tt.ms) * time.Millisecond).Sub(a.At); early > 0 {
					t.Errorf("%s: arrived %v before its delay of %d ms", tt.name, early, tt.ms)
				}
			}
		}
	})
}

// TestXDelay_RoutedAtOnce: x-delay zero, negative, below one millisecond or
// missing is routed at once, never stored, with the header as it was.
func TestXDelay_RoutedAtOnce(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
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
		tp, ch := startConfirmedOn(t, b)
		ex, _, cons := delayedFanoutOn(t, b, ch)
		for _, tt := range tests {
			publishConfirmed(t, ch, ex, "", false, amqp.Publishing{Headers: tt.headers, MessageId: tt.name})
		}
		// A held message after them: once it is confirmed, everything before it
		// has been decided.
		publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(3_600_000), "held"))
		got := cons.waitByID(t, len(tests), 20*time.Second)
		for _, tt := range tests {
			a, ok := arrived(t, got, tt.name)
			if !ok {
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
	})
}

// TestXDelay_Refused: an x-delay that is not a number, or above
// --max-delay, closes the channel with 406 naming the header, as does a body
// above --max-message-size; nothing is stored and the connection stays
// usable.
func TestXDelay_Refused(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp := startProxyOn(t, b, func(c *delayproxy.Config) { c.MaxDelay, c.MaxMessageSize = time.Hour, 1024 })
		conn := tp.dial(t)
		ex := declareDelayedOn(t, b, testbroker.Channel(t, conn), "fanout", nil)
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
				ch := testbroker.Channel(t, conn)
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
				e := testbroker.AwaitClose(t, closed, 15*time.Second)
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
	})
}

// TestXDelay_BeyondUint32IsHeld: unlike the plugin, which routed them at
// once, delays above 2^32-1 ms are held; the admin API counts and cancels
// them.
func TestXDelay_BeyondUint32IsHeld(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		ex, q := delayedQueueOn(t, b, ch, "fanout", "")
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
		if n := b.QueueDepth(t, q); n != 0 {
			t.Fatalf("a held message reached the queue (%d)", n)
		}
	})
}

// TestConfirm_AfterStore: the publisher's ack comes only once the message is
// stored (the admin API counts it at that moment); channels without
// confirm mode are delayed too.
func TestConfirm_AfterStore(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, conn := startDialledOn(t, b)
		ch := confirmChannel(t, conn)
		ex, _, cons := delayedFanoutOn(t, b, ch)

		for i := range 20 {
			publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(3_600_000), fmt.Sprint("c", i)))
			if n := tp.pending(t, ex); n != int64(i+1) {
				t.Fatalf("after ack %d the admin API counts %d pending", i+1, n)
			}
		}
		// Without confirm mode.
		plain := testbroker.Channel(t, conn)
		start := time.Now()
		publish(t, plain, ex, "", delayedMsg(int32(400), "plain"))
		testwait.Until(t, 10*time.Second, "the unconfirmed publish to be stored", func() bool { return tp.pending(t, ex) == 21 })
		got := cons.wait(t, 1, 20*time.Second)
		if got[0].MessageId != "plain" || got[0].At.Before(start.Add(400*time.Millisecond)) {
			t.Fatalf("got %s at +%v", got[0].MessageId, got[0].At.Sub(start))
		}
		if n := tp.metric(t, "delayproxy_messages_stored_total"); n != 21 {
			t.Errorf("messages_stored_total = %v, want 21", n)
		}
	})
}

// TestTx_StoredAtCommit: in a transaction, delayed publishes are stored at
// tx.commit and dropped at tx.rollback.
func TestTx_StoredAtCommit(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp := startProxyOn(t, b, nil)
		ch := testbroker.Channel(t, tp.dial(t))
		ex, q, cons := delayedFanoutOn(t, b, ch)
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
		if n := b.QueueDepth(t, q) + len(cons.snapshot()); n != 0 {
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
		if !slices.Equal(messageIDs(got), []string{"not-delayed", "committed-1", "committed-2"}) {
			t.Fatalf("arrived %v", messageIDs(got))
		}
		if got[1].At.Before(start.Add(time.Second)) {
			t.Errorf("committed message arrived early")
		}
		testwait.Until(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
		if n := b.QueueDepth(t, q) + len(cons.snapshot()); n != 3 {
			t.Fatalf("%d messages reached the queue, want 3 (no rolled-back one)", n)
		}
	})
}

// TestMandatory_NoReturnAtPublish: a mandatory publish to a delayed exchange
// without bindings is confirmed and not returned; at release RabbitMQ
// returns it to the proxy, which counts it.
func TestMandatory_NoReturnAtPublish(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		returns := ch.NotifyReturn(make(chan amqp.Return, 10))
		ex := declareDelayedOn(t, b, ch, "direct", nil)
		publishConfirmed(t, ch, ex, "nowhere", true, delayedMsg(int32(300), "m"))
		testwait.Until(t, 20*time.Second, "the unroutable counter to move", func() bool {
			return tp.metric(t, "delayproxy_messages_unroutable_total") == 1
		})
		// RabbitMQ confirms a returned message too: it leaves the store.
		testwait.Until(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
		if n := tp.metric(t, "delayproxy_messages_released_total"); n != 1 {
			t.Errorf("messages_released_total = %v, want 1", n)
		}
		// A relayed publish on the same channel is returned as usual, so returns
		// reach this client: the delayed one was not.
		if err := ch.PublishWithContext(context.Background(), "", testbroker.UniqueName(t, "noqueue"), true, false, amqp.Publishing{MessageId: "plain"}); err != nil {
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
	})
}
