package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// Declaring and deleting delayed exchanges through the proxy: RabbitMQ's
// own answers for bad declares, redeclares, no-wait declares, and what a
// delete does to pending messages.

// TestDelayedExchange_DeclareErrors: a bad x-delayed-type gets the plugin's
// code and text; an unknown type gets RabbitMQ's own answer, exactly as a
// client connected straight to RabbitMQ gets it.
func TestDelayedExchange_DeclareErrors(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		const mustExist = "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
		tp := startProxyOn(t, b, nil)

		// What RabbitMQ itself answers for an unknown exchange type: 3.10
		// closes the connection (503), 4.3 only the channel (406).
		direct := testbroker.Dial(t, b.URL)
		dch := testbroker.Channel(t, direct)
		dchClosed := dch.NotifyClose(make(chan *amqp.Error, 1))
		err := dch.ExchangeDeclare(testbroker.UniqueName(t, "nope"), "x-nope", false, true, false, false, nil)
		want := testbroker.AwaitClose(t, dchClosed, 15*time.Second)
		if !errorIs(err, want.Code, "x-nope") {
			t.Fatalf("RabbitMQ answered an unknown type with %v", err)
		}
		wantConnLevel := direct.IsClosed() // set before its channels are told

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
			{name: "unknown type", args: amqp.Table{"x-delayed-type": "x-nope"}, code: want.Code, reason: want.Reason, connLevel: wantConnLevel},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				conn := tp.dial(t)
				connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
				ch := testbroker.Channel(t, conn)
				chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
				name := testbroker.UniqueName(t, "x")
				err := ch.ExchangeDeclare(name, "x-delayed-message", true, false, false, false, tt.args)
				if !errorIs(err, tt.code, tt.reason) || err.(*amqp.Error).Reason != tt.reason {
					t.Fatalf("declare = %v, want %d %q", err, tt.code, tt.reason)
				}
				testbroker.AwaitClose(t, chClosed, 15*time.Second)
				if tt.connLevel {
					if e := testbroker.AwaitClose(t, connClosed, 15*time.Second); e.Code != tt.code {
						t.Errorf("connection closed with %v, want %d", e, tt.code)
					}
				} else if conn.IsClosed() {
					t.Error("a channel error closed the connection")
				} else {
					// The connection still works.
					if _, err := testbroker.Channel(t, conn).QueueDeclare("", false, true, true, false, nil); err != nil {
						t.Errorf("connection unusable after the channel error: %v", err)
					}
				}
				if code, body := tp.httpDo(t, http.MethodGet, exchangePath(name)); code != http.StatusNotFound {
					t.Errorf("refused exchange is in the registry: %d %s", code, body)
				}
				bch := testbroker.Channel(t, testbroker.Dial(t, b.URL))
				if err := bch.ExchangeDeclarePassive(name, "direct", true, false, false, false, nil); !errorIs(err, amqp.NotFound, "") {
					t.Errorf("refused exchange exists upstream: %v", err)
					bch2 := testbroker.Channel(t, testbroker.Dial(t, b.URL))
					bch2.ExchangeDelete(name, false, false)
				}
			})
		}
	})
}

// TestDelayedExchange_Redeclare: passive declares work on a delayed
// exchange; redeclaring with the same arguments keeps pending messages;
// different arguments get RabbitMQ's 406 and change nothing.
func TestDelayedExchange_Redeclare(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, conn := startDialledOn(t, b)
		ch := confirmChannel(t, conn)
		ex := declareDelayedOn(t, b, ch, "direct", amqp.Table{"note": "v1"})
		q := b.DeclareQueue(t, true, nil)
		bindOn(t, b, q, "k", ex, nil)
		cons := consume(t, testbroker.Dial(t, b.URL), q)

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
			ch2 := testbroker.Channel(t, conn)
			err := ch2.ExchangeDeclare(ex, "x-delayed-message", tt.durable, false, false, false, tt.args)
			if !errorIs(err, amqp.PreconditionFailed, tt.reason) {
				t.Errorf("%s: redeclare = %v, want 406 %q", tt.name, err, tt.reason)
			}
		}
		// Passive declares of a missing exchange: RabbitMQ's 404.
		ch3 := testbroker.Channel(t, conn)
		if err := ch3.ExchangeDeclarePassive(testbroker.UniqueName(t, "missing"), "x-delayed-message", true, false, false, false, nil); !errorIs(err, amqp.NotFound, "no exchange") {
			t.Errorf("passive declare of a missing exchange = %v, want 404", err)
		}

		// Nothing changed: the exchange is still delayed and direct.
		after := time.Now()
		publishConfirmed(t, ch, ex, "k", false, delayedMsg(int32(300), "after"))
		publishConfirmed(t, ch, ex, "other-key", false, delayedMsg(int32(300), "unroutable"))
		got := cons.waitByID(t, 2, 20*time.Second)
		for _, m := range []struct {
			id  string
			due time.Time
		}{{"before", start.Add(1500 * time.Millisecond)}, {"after", after.Add(300 * time.Millisecond)}} {
			if a, ok := arrived(t, got, m.id); ok && a.At.Before(m.due) {
				t.Errorf("%s arrived %v early", m.id, m.due.Sub(a.At))
			}
		}
		time.Sleep(200 * time.Millisecond) // the unroutable one would have come with "after"
		if n := len(cons.snapshot()); n != 2 {
			t.Errorf("queue got %d messages, want 2", n)
		}
	})
}

// TestDelayedExchange_NoWaitDeclareThenPublish: a publish sent right after a
// no-wait declare, without waiting for anything, is still delayed.
func TestDelayedExchange_NoWaitDeclareThenPublish(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		_, conn := startDialledOn(t, b)
		ch := testbroker.Channel(t, conn)
		ex := testbroker.UniqueName(t, "x")
		t.Cleanup(func() { b.DeleteExchange(t, ex) })
		start := time.Now()
		if err := ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, true, amqp.Table{"x-delayed-type": "fanout"}); err != nil {
			t.Fatal(err)
		}
		publish(t, ch, ex, "", delayedMsg("800", "nowait"))
		// The binding comes after the publish: the message is routed at release.
		q := b.DeclareQueue(t, true, nil)
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
	})
}

// TestExchangeDelete_DiscardsPending: deleting a delayed exchange discards
// its pending messages (counted), and a re-created exchange of the same name
// never gets them.
func TestExchangeDelete_DiscardsPending(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		ex, q, cons := delayedFanoutOn(t, b, ch)
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
		bindOn(t, b, q, "", ex, nil)
		publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(900), "new"))
		got := cons.wait(t, 1, 20*time.Second)
		testwait.Until(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
		if all := append(messageIDs(got), messageIDs(cons.snapshot()[len(got):])...); !slices.Equal(all, []string{"new"}) {
			t.Fatalf("arrived %v, want only [new]", all)
		}
		if n := b.QueueDepth(t, q); n != 0 {
			t.Fatalf("%d more messages in the queue", n)
		}
		// The scheduler has met the stale messages by now (they were due before
		// the new one): they are not counted twice.
		if n := tp.metric(t, "delayproxy_messages_discarded_total"); n != 5 {
			t.Errorf("messages_discarded_total = %v after the release, want 5", n)
		}
	})
}

// TestDelayedExchange_FirstOfAVHostWarmsTheReleaser: the proxy dials its
// release connection to a vhost when the vhost's first delayed exchange is
// recorded (a declare, or the first delivery-time publish to an exchange),
// not at the first release, which would otherwise be late by a dial. The
// vhost is the test's own, so the connection is this proxy's.
func TestDelayedExchange_FirstOfAVHostWarmsTheReleaser(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		record func(t *testing.T, ch *amqp.Channel)
	}{
		{name: "x-delayed-message declare", record: func(t *testing.T, ch *amqp.Channel) {
			if err := ch.ExchangeDeclare("dp-warm.x", "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "direct"}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "delivery-time publish", record: func(t *testing.T, ch *amqp.Channel) {
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
			due := time.Now().Add(time.Hour).UnixMilli()
			if err := ch.Publish("amq.direct", "nowhere", false, false, amqp.Publishing{Headers: amqp.Table{"x-opt-delivery-time": due}}); err != nil {
				t.Fatal(err)
			}
			if c := <-confirms; !c.Ack {
				t.Fatal("delivery-time publish nacked")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vh := testbroker.VHost(t, "dp-rel-")
			tp := startProxy(t, nil)
			releaser := `"delayproxy releaser ` + vh + `"`
			listed := func() bool {
				return strings.Contains(testbroker.Ctl(t, "list_connections", "client_properties"), releaser)
			}
			if listed() {
				t.Fatalf("a release connection to %s before anything was recorded in it", vh)
			}
			tt.record(t, testbroker.Channel(t, testbroker.Dial(t, withVHost(t, tp.URL(), vh))))
			testwait.Until(t, 15*time.Second, "the release connection to "+vh, listed)
		})
	}
}
