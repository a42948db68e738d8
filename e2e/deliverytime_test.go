package e2e

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// RabbitMQ 4.4's delivery-time headers (x-opt-delivery-time, absolute unix
// ms; x-opt-delivery-delay, ms) on ordinary exchanges, through the proxy,
// on RabbitMQ 3.10 and 4.3.

const (
	hTime  = "x-opt-delivery-time"
	hDelay = "x-opt-delivery-delay"
)

// dtMsg is a persistent publishing with the given headers and message-id.
func dtMsg(headers amqp.Table, id string) amqp.Publishing {
	return amqp.Publishing{Headers: headers, DeliveryMode: amqp.Persistent, MessageId: id, Body: []byte("body of " + id)}
}

// defaultPath is the admin API path of the default exchange in vhost "/".
var defaultPath = exchangePath(admin.DefaultExchangeAlias)

// sameHeaders compares the headers a message was published with and
// arrived with, timestamps by their second.
func sameHeaders(got, want amqp.Table) bool {
	norm := func(t amqp.Table) amqp.Table {
		out := amqp.Table{}
		for k, v := range t {
			if tv, ok := v.(time.Time); ok {
				v = tv.Unix()
			}
			out[k] = v
		}
		return out
	}
	return reflect.DeepEqual(norm(got), norm(want))
}

// TestDeliveryTime_ValueTypes: through the default exchange to a classic
// queue, each header as every integer type amqp091-go writes (and
// x-opt-delivery-time as a timestamp) is held until its time, never early,
// and arrives with its headers exactly as sent; a time in the past, a zero
// or negative delay, and the types RabbitMQ does not read as a time
// (strings, floats) are relayed at once, never stored. With both headers,
// x-opt-delivery-time decides.
func TestDeliveryTime_ValueTypes(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		q := b.DeclareQueue(t, true, nil)
		cons := consume(t, testbroker.Dial(t, b.URL), q)
		now := time.Now()
		at := func(d time.Duration) int64 { return now.Add(d).UnixMilli() }
		secs := now.Add(2 * time.Second).Truncate(time.Second).Add(time.Second) // a whole second, 2-3 s ahead
		tests := []struct {
			name    string
			headers amqp.Table
			due     time.Time // zero: relayed at once
		}{
			{"delay int8", amqp.Table{hDelay: int8(120)}, now.Add(120 * time.Millisecond)},
			{"delay uint8", amqp.Table{hDelay: uint8(250)}, now.Add(250 * time.Millisecond)},
			{"delay int16", amqp.Table{hDelay: int16(310)}, now.Add(310 * time.Millisecond)},
			{"delay uint16", amqp.Table{hDelay: uint16(320)}, now.Add(320 * time.Millisecond)},
			{"delay int32", amqp.Table{hDelay: int32(330)}, now.Add(330 * time.Millisecond)},
			{"delay uint32", amqp.Table{hDelay: uint32(350)}, now.Add(350 * time.Millisecond)},
			{"delay int64", amqp.Table{hDelay: int64(360)}, now.Add(360 * time.Millisecond)},
			{"time int64", amqp.Table{hTime: at(700 * time.Millisecond)}, time.UnixMilli(at(700 * time.Millisecond))},
			{"time timestamp", amqp.Table{hTime: secs}, secs},
			{"both: the time decides", amqp.Table{hTime: at(900 * time.Millisecond), hDelay: int32(100)}, time.UnixMilli(at(900 * time.Millisecond))},
			{"time in the past", amqp.Table{hTime: at(-time.Second)}, time.Time{}},
			{"zero delay", amqp.Table{hDelay: int32(0)}, time.Time{}},
			{"negative delay", amqp.Table{hDelay: int32(-500)}, time.Time{}},
			{"delay string", amqp.Table{hDelay: "5000"}, time.Time{}},
			{"delay float", amqp.Table{hDelay: 5000.0}, time.Time{}},
			{"time string", amqp.Table{hTime: fmt.Sprint(at(5 * time.Second))}, time.Time{}},
			{"time float", amqp.Table{hTime: float64(at(5 * time.Second))}, time.Time{}},
		}
		held := 0
		for _, tt := range tests {
			publishConfirmed(t, ch, "", q, false, dtMsg(tt.headers, tt.name))
			if !tt.due.IsZero() {
				held++
			}
		}
		got := cons.waitByID(t, len(tests), 20*time.Second)
		for _, tt := range tests {
			a, ok := arrived(t, got, tt.name)
			if !ok {
				continue
			}
			if !sameHeaders(a.Headers, tt.headers) {
				t.Errorf("%s: arrived with headers %#v, want %#v", tt.name, a.Headers, tt.headers)
			}
			if early := tt.due.Sub(a.At); !tt.due.IsZero() && early > 0 {
				t.Errorf("%s: arrived %v early", tt.name, early)
			}
		}
		if n := tp.metric(t, "delayproxy_messages_stored_total"); n != float64(held) {
			t.Errorf("stored %v messages, want the %d held", n, held)
		}
	})
}

// TestDeliveryTime_QuorumAndClassicThroughDefaultExchange: the default
// exchange routes a held message to a quorum and to a classic queue by
// name, in due order; the admin API lists and counts them under the
// default exchange (amq.default in its paths), of kind delivery-time.
func TestDeliveryTime_QuorumAndClassicThroughDefaultExchange(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		quorum := b.DeclareQueue(t, true, amqp.Table{"x-queue-type": "quorum"})
		classic := b.DeclareQueue(t, true, amqp.Table{"x-queue-type": "classic"})
		qc, cc := consume(t, testbroker.Dial(t, b.URL), quorum), consume(t, testbroker.Dial(t, b.URL), classic)
		// Due times fixed before the first publish, so the order does not
		// hang on how long each confirm takes on a loaded machine.
		start := time.Now()
		due := func(i int) time.Time { return start.Add(time.Duration(3000-200*i) * time.Millisecond) }
		for i := range 5 {
			for _, q := range []string{quorum, classic} {
				publishConfirmed(t, ch, "", q, false, dtMsg(amqp.Table{hTime: due(i).UnixMilli()}, fmt.Sprint(i)))
			}
		}
		var e admin.Exchange
		getJSON(t, tp, defaultPath, &e)
		if e.Kind != admin.KindDeliveryTime || e.Name != "" || e.Pending != 10 {
			t.Errorf("default exchange in the admin API: %+v, want kind %s, 10 pending", e, admin.KindDeliveryTime)
		}
		if n := len(tp.listPending(t, admin.DefaultExchangeAlias)); n != 10 {
			t.Errorf("listed %d pending, want 10", n)
		}
		if late := time.Since(due(4)); late >= 0 {
			t.Fatalf("publishing and the admin checks ended %v after the first due time", late)
		}
		want := []string{"4", "3", "2", "1", "0"}
		if got := messageIDs(qc.wait(t, 5, 20*time.Second)); !slices.Equal(got, want) {
			t.Errorf("quorum queue got %v, want %v", got, want)
		}
		if got := messageIDs(cc.wait(t, 5, 20*time.Second)); !slices.Equal(got, want) {
			t.Errorf("classic queue got %v, want %v", got, want)
		}
		testwait.Until(t, 10*time.Second, "nothing pending", func() bool { return tp.pending(t, admin.DefaultExchangeAlias) == 0 })
	})
}

// TestDeliveryTime_TopicTwoBindings: a topic exchange (not a delayed one)
// with two bindings: a held message whose key matches both reaches both
// queues, one matching one reaches that queue only, none early.
func TestDeliveryTime_TopicTwoBindings(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		ex := declarePlainExchangeOn(t, b, "topic")
		qa, qb := b.DeclareQueue(t, true, nil), b.DeclareQueue(t, true, nil)
		bindOn(t, b, qa, "order.*", ex, nil)
		bindOn(t, b, qb, "*.created", ex, nil)
		ca, cb := consume(t, testbroker.Dial(t, b.URL), qa), consume(t, testbroker.Dial(t, b.URL), qb)
		start := time.Now()
		due := start.Add(800 * time.Millisecond).UnixMilli()
		publishConfirmed(t, ch, ex, "order.created", false, dtMsg(amqp.Table{hTime: due}, "both"))
		publishConfirmed(t, ch, ex, "order.paid", false, dtMsg(amqp.Table{hDelay: int16(600)}, "a-only"))
		var e admin.Exchange
		getJSON(t, tp, exchangePath(ex), &e)
		if e.Kind != admin.KindDeliveryTime || e.Pending != 2 {
			t.Errorf("exchange in the admin API: %+v, want kind %s, 2 pending", e, admin.KindDeliveryTime)
		}
		got := ca.wait(t, 2, 20*time.Second)
		if ids := messageIDs(got); !slices.Equal(ids, []string{"a-only", "both"}) {
			t.Errorf("queue order.* got %v", ids)
		}
		gotB := cb.wait(t, 1, 20*time.Second)
		if gotB[0].MessageId != "both" || gotB[0].At.Before(time.UnixMilli(due)) {
			t.Errorf("queue *.created got %s at +%v, due +800ms", gotB[0].MessageId, gotB[0].At.Sub(start))
		}
		for _, a := range got {
			if a.MessageId == "both" && a.At.Before(time.UnixMilli(due)) {
				t.Errorf("arrived %v early", time.UnixMilli(due).Sub(a.At))
			}
		}
		time.Sleep(200 * time.Millisecond) // nothing more comes
		if n := len(cb.snapshot()); n != 1 {
			t.Errorf("queue *.created got %d messages, want 1", n)
		}
	})
}

// TestDeliveryTime_MaxDelay: a delivery time or delay further ahead than
// --max-delay is refused with 406 naming the header; nothing is stored.
func TestDeliveryTime_MaxDelay(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp := startProxyOn(t, b, func(c *delayproxy.Config) { c.MaxDelay = time.Hour })
		conn := tp.dial(t)
		q := b.DeclareQueue(t, true, nil)
		for _, tt := range []struct {
			header string
			value  any
		}{
			{hTime, time.Now().Add(2 * time.Hour).UnixMilli()},
			{hDelay, int64(2 * time.Hour / time.Millisecond)},
		} {
			ch := testbroker.Channel(t, conn)
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			publish(t, ch, "", q, dtMsg(amqp.Table{tt.header: tt.value}, "too-far"))
			e := testbroker.AwaitClose(t, closed, 15*time.Second)
			if e.Code != amqp.PreconditionFailed || !errorIs(e, amqp.PreconditionFailed, tt.header) {
				t.Errorf("%s too far ahead: channel closed with %v, want 406 naming the header", tt.header, e)
			}
		}
		if n := tp.metric(t, "delayproxy_messages_stored_total"); n != 0 {
			t.Errorf("stored %v messages, want none", n)
		}
	})
}

// TestDeliveryTime_OnDelayedExchange: on an x-delayed-message exchange
// x-delay decides; the delivery-time headers ride along unchanged.
func TestDeliveryTime_OnDelayedExchange(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		_, ch := startConfirmedOn(t, b)
		ex, _, cons := delayedFanoutOn(t, b, ch)
		far := time.Now().Add(time.Hour).UnixMilli()
		start := time.Now()
		publishConfirmed(t, ch, ex, "", false, dtMsg(amqp.Table{"x-delay": int32(300), hTime: far, hDelay: int32(3_600_000)}, "x"))
		a := cons.wait(t, 1, 20*time.Second)[0]
		if a.At.Before(start.Add(300 * time.Millisecond)) {
			t.Errorf("arrived at +%v, before its x-delay", a.At.Sub(start))
		}
		want := amqp.Table{"x-delay": int64(-300), hTime: far, hDelay: int32(3_600_000)}
		if !reflect.DeepEqual(a.Headers, want) {
			t.Errorf("headers %#v, want %#v", a.Headers, want)
		}
	})
}

// TestDeliveryTime_FlagOff: with --delivery-time-headers=false the headers
// are relayed untouched, for RabbitMQ 4.4 itself to read.
func TestDeliveryTime_FlagOff(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp := startProxyOn(t, b, func(c *delayproxy.Config) { c.DeliveryTimeHeaders = false })
		ch := confirmChannel(t, tp.dial(t))
		q := b.DeclareQueue(t, true, nil)
		cons := consume(t, testbroker.Dial(t, b.URL), q)
		headers := amqp.Table{hDelay: int32(3_600_000), hTime: time.Now().Add(time.Hour).UnixMilli()}
		publishConfirmed(t, ch, "", q, false, dtMsg(headers, "untouched"))
		if a := cons.wait(t, 1, 10*time.Second)[0]; !reflect.DeepEqual(a.Headers, headers) {
			t.Errorf("headers %#v, want %#v", a.Headers, headers)
		}
		if n := tp.metric(t, "delayproxy_messages_stored_total"); n != 0 {
			t.Errorf("stored %v messages, want none", n)
		}
	})
}

// TestDeliveryTime_CancelAndRestart: held messages are listed and
// cancelled by message-id through the admin API under their exchange, and
// survive a restart of the proxy: each of the others is released once,
// after its time.
func TestDeliveryTime_CancelAndRestart(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		q := b.DeclareQueue(t, true, nil)
		due := time.Now().Add(3 * time.Second)
		for _, id := range []string{"a", "b", "c", "b"} {
			publishConfirmed(t, ch, "", q, false, dtMsg(amqp.Table{hTime: due.UnixMilli()}, id))
		}
		if code, body := tp.httpDo(t, http.MethodDelete, defaultPath+"/messages/b"); code != http.StatusOK {
			t.Fatalf("cancel b: %d %s", code, body)
		}
		var ids []string
		for _, m := range tp.listPending(t, admin.DefaultExchangeAlias) {
			ids = append(ids, m.MessageID)
		}
		if !slices.Equal(ids, []string{"a", "c"}) {
			t.Fatalf("pending after cancelling b: %v, want [a c]", ids)
		}
		tp.restart()
		if n := tp.pending(t, admin.DefaultExchangeAlias); n != 2 {
			t.Fatalf("pending after the restart: %d, want 2", n)
		}
		testwait.Until(t, 20*time.Second, "both released", func() bool { return tp.pending(t, admin.DefaultExchangeAlias) == 0 })
		if time.Now().Before(due) {
			t.Errorf("released %v before their time", time.Until(due))
		}
		ids = nil
		for _, d := range drainOn(t, b, q) {
			ids = append(ids, d.MessageId)
		}
		if !slices.Equal(ids, []string{"a", "c"}) {
			t.Errorf("released %v, want [a c] once each", ids)
		}
	})
}

// TestDeliveryTime_PriorityDueTogether: messages published with one
// x-opt-delivery-time are due at one millisecond, and arrive highest
// priority first, in publish order within a priority.
func TestDeliveryTime_PriorityDueTogether(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		_, ch := startConfirmedOn(t, b)
		q := b.DeclareQueue(t, true, nil) // classic, no x-max-priority: arrival order is release order
		cons := consume(t, testbroker.Dial(t, b.URL), q)
		due := time.Now().Add(2 * time.Second).UnixMilli()
		const n = 60
		var dcs []*amqp.DeferredConfirmation
		for i := range n {
			msg := dtMsg(amqp.Table{hTime: due}, fmt.Sprintf("%d-%02d", i%6, i))
			msg.Priority = uint8(i % 6)
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, msg)
			if err != nil {
				t.Fatal(err)
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
				t.Fatalf("publish: %v %v", ok, err)
			}
		}
		if time.Now().UnixMilli() >= due {
			t.Fatal("publishing took longer than the time the messages were due")
		}
		got := messageIDs(cons.wait(t, n, 20*time.Second))
		want := slices.Clone(got)
		slices.SortStableFunc(want, func(a, b string) int { return int(b[0]) - int(a[0]) }) // priority digit, descending
		if !slices.Equal(got, want) {
			t.Errorf("arrival order %v, want by priority then publish order", got)
		}
		if got[0][0] != '5' || got[n-1][0] != '0' {
			t.Errorf("first %s, last %s: want priority 5 first, 0 last", got[0], got[n-1])
		}
	})
}

// TestDeliveryTime_NeedsWritePermission: a user without write permission
// on the exchange is refused with RabbitMQ's own 403, and nothing is
// stored or registered; an allowed user's message is held.
func TestDeliveryTime_NeedsWritePermission(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp := startProxyOn(t, b, nil)
		ex := declarePlainExchangeOn(t, b, "direct")
		q := b.DeclareQueue(t, true, nil)
		bindOn(t, b, q, "k", ex, nil)
		user, pass := "dp-dt-"+randHex(t, 4), randHex(t, 8)
		b.AddUser(t, user, pass)
		b.Ctl(t, "set_permissions", "-p", "/", user, "", "^amq\\.default$", "")
		conn := testbroker.Dial(t, withUser(t, tp.URL(), user, pass))
		direct := testbroker.Dial(t, withUser(t, b.URL, user, pass))
		refused := func(conn *amqp.Connection) string {
			ch := testbroker.Channel(t, conn)
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			publish(t, ch, ex, "k", dtMsg(amqp.Table{hDelay: int32(60_000)}, "refused"))
			e := testbroker.AwaitClose(t, closed, 15*time.Second)
			if e.Code != amqp.AccessRefused {
				t.Fatalf("closed with %v, want 403", e)
			}
			return e.Reason
		}
		if got, want := refused(conn), refused(direct); got != want {
			t.Errorf("proxy says %q, RabbitMQ says %q", got, want)
		}
		if code, _ := tp.httpDo(t, http.MethodGet, exchangePath(ex)); code != http.StatusNotFound {
			t.Errorf("refused exchange is in the registry: GET answered %d", code)
		}
		if n := tp.metric(t, "delayproxy_messages_stored_total"); n != 0 {
			t.Errorf("stored %v messages, want none", n)
		}
		// Allowed on the default exchange: held.
		publishConfirmed(t, confirmChannel(t, conn), "", q, false, dtMsg(amqp.Table{hDelay: int32(60_000)}, "allowed"))
		if n := tp.pending(t, admin.DefaultExchangeAlias); n != 1 {
			t.Errorf("default exchange holds %d, want the allowed one", n)
		}
	})
}

// TestDeliveryTime_ExchangeGoneAtRelease: an exchange deleted in RabbitMQ
// while it holds delivery-time messages is not declared again by the
// proxy: at release its message is dropped after the bounded checks and
// counted as unroutable.
func TestDeliveryTime_ExchangeGoneAtRelease(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		ex := declarePlainExchangeOn(t, b, "fanout")
		publishConfirmed(t, ch, ex, "", false, dtMsg(amqp.Table{hDelay: int32(500)}, "orphan"))
		b.DeleteExchange(t, ex)
		testwait.Until(t, 30*time.Second, "the message dropped", func() bool { return tp.pending(t, ex) == 0 })
		if n := tp.metric(t, "delayproxy_messages_unroutable_total"); n != 1 {
			t.Errorf("unroutable = %v, want 1", n)
		}
		probe := testbroker.Channel(t, testbroker.Dial(t, b.URL))
		if err := probe.ExchangeDeclarePassive(ex, "fanout", true, false, false, false, nil); err == nil {
			t.Error("the proxy declared the exchange again")
		}
	})
}

// TestDeliveryTime_ThenDeclaredDelayed: an exchange holding delivery-time
// messages that a client then declares x-delayed-message (with its own
// type) becomes a delayed exchange; the messages it held are released
// unchanged at their time, and x-delay decides from then on.
func TestDeliveryTime_ThenDeclaredDelayed(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		ex := declarePlainExchangeOn(t, b, "fanout")
		q := b.DeclareQueue(t, true, nil)
		bindOn(t, b, q, "", ex, nil)
		cons := consume(t, testbroker.Dial(t, b.URL), q)
		due := time.Now().Add(time.Second).UnixMilli()
		publishConfirmed(t, ch, ex, "", false, dtMsg(amqp.Table{hTime: due}, "dt"))
		if err := ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "fanout"}); err != nil {
			t.Fatalf("declare as delayed: %v", err)
		}
		var e admin.Exchange
		getJSON(t, tp, exchangePath(ex), &e)
		if e.Kind != admin.KindDelayed || e.DelayedType != "fanout" || e.Pending != 1 {
			t.Errorf("after the declare: %+v, want a delayed fanout exchange holding 1", e)
		}
		publishConfirmed(t, ch, ex, "", false, dtMsg(amqp.Table{"x-delay": int32(100), hDelay: int32(3_600_000)}, "xd"))
		got := cons.waitByID(t, 2, 20*time.Second)
		if a, ok := arrived(t, got, "dt"); ok && (a.At.Before(time.UnixMilli(due)) || !reflect.DeepEqual(a.Headers, amqp.Table{hTime: due})) {
			t.Errorf("dt: arrived at %v (due %v) with %#v", a.At, time.UnixMilli(due), a.Headers)
		}
		if a, ok := arrived(t, got, "xd"); ok && a.Headers["x-delay"] != int64(-100) {
			t.Errorf("xd: headers %#v, want x-delay -100", a.Headers)
		}
	})
}

// TestDeliveryTime_InTransaction: a delivery-time publish in a transaction
// is stored at tx.commit and dropped at tx.rollback, as a delayed one.
func TestDeliveryTime_InTransaction(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, conn := startDialledOn(t, b)
		ch := testbroker.Channel(t, conn)
		if err := ch.Tx(); err != nil {
			t.Fatal(err)
		}
		q := b.DeclareQueue(t, true, nil)
		cons := consume(t, testbroker.Dial(t, b.URL), q)
		publish(t, ch, "", q, dtMsg(amqp.Table{hDelay: int32(300)}, "rolled-back"))
		if err := ch.TxRollback(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		publish(t, ch, "", q, dtMsg(amqp.Table{hDelay: int32(300)}, "committed"))
		if err := ch.TxCommit(); err != nil {
			t.Fatal(err)
		}
		if n := tp.pending(t, admin.DefaultExchangeAlias); n != 1 {
			t.Errorf("pending after commit: %d, want 1", n)
		}
		a := cons.wait(t, 1, 20*time.Second)[0]
		if a.MessageId != "committed" || a.At.Before(start.Add(300*time.Millisecond)) {
			t.Errorf("got %s at +%v", a.MessageId, a.At.Sub(start))
		}
		time.Sleep(300 * time.Millisecond)
		if n := len(cons.snapshot()); n != 1 {
			t.Errorf("%d messages arrived, want the committed one", n)
		}
	})
}
