package e2e

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// End-to-end tests of delayed-message exchanges through the whole proxy
// (listener, interceptor, store, scheduler, releaser, admin) against the
// real RabbitMQ: every row of DESIGN.md's "Compatibility with the plugin".
// This file: routing and release; declares and deletes are in
// delayed_declare_test.go, publishing in delayed_publish_test.go.

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
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
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
				tp, conn := startDialledOn(t, b)
				ch := confirmChannel(t, conn)
				ex := declareDelayedOn(t, b, ch, tt.typ, nil)

				// The real exchange upstream is a plain one of the underlying
				// type, arguments unchanged: an equivalent declare succeeds.
				bch := testbroker.Channel(t, testbroker.Dial(t, b.URL))
				if err := bch.ExchangeDeclare(ex, tt.typ, true, false, false, false, amqp.Table{"x-delayed-type": tt.typ}); err != nil {
					t.Fatalf("upstream exchange is not a %s exchange: %v", tt.typ, err)
				}

				var queues [2]string
				var cons [2]*consumer
				for i, bd := range tt.bindings {
					queues[i] = b.DeclareQueue(t, true, nil)
					// Bindings go through the proxy, relayed unchanged.
					if err := ch.QueueBind(queues[i], bd.key, ex, false, bd.args); err != nil {
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
				testwait.Until(t, 20*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
				for q := range 2 {
					got := cons[q].stop(t)
					if gotIDs := messageIDs(got); !slices.Equal(gotIDs, want[q]) {
						t.Errorf("queue %d (binding %q %v) got %v, want %v", q, tt.bindings[q].key, tt.bindings[q].args, gotIDs, want[q])
					}
					if n := b.QueueDepth(t, queues[q]); n != 0 {
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
	})
}

// TestRelease_MessageUnchanged: the released message has the original
// routing key, properties and body; only x-delay becomes -delay.
func TestRelease_MessageUnchanged(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		_, ch := startConfirmedOn(t, b)
		ex, q := delayedQueueOn(t, b, ch, "direct", "route.me")
		cons := consume(t, testbroker.Dial(t, b.URL), q)
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
	})
}

// TestAlternateExchange_AtRelease: the delayed exchange's alternate-exchange
// gets unroutable messages at release time, not at publish.
func TestAlternateExchange_AtRelease(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, ch := startConfirmedOn(t, b)
		ae := declarePlainExchangeOn(t, b, "fanout")
		aeQueue := b.DeclareQueue(t, true, nil)
		bindOn(t, b, aeQueue, "", ae, nil)
		ex := declareDelayedOn(t, b, ch, "direct", amqp.Table{"alternate-exchange": ae})
		bound := b.DeclareQueue(t, true, nil)
		bindOn(t, b, bound, "k", ex, nil)
		aeCons := consume(t, testbroker.Dial(t, b.URL), aeQueue)
		boundCons := consume(t, testbroker.Dial(t, b.URL), bound)

		start := time.Now()
		publishConfirmed(t, ch, ex, "unbound", true, delayedMsg(int32(700), "to-ae"))
		publishConfirmed(t, ch, ex, "k", true, delayedMsg(int32(700), "routed"))
		if got := aeCons.snapshot(); len(got) != 0 {
			t.Fatalf("alternate exchange got %v at publish", messageIDs(got))
		}
		a := aeCons.wait(t, 1, 20*time.Second)[0]
		if a.MessageId != "to-ae" || a.At.Before(start.Add(700*time.Millisecond)) {
			t.Fatalf("alternate exchange got %s at +%v, want to-ae after 700ms", a.MessageId, a.At.Sub(start))
		}
		if d := boundCons.wait(t, 1, 20*time.Second)[0]; d.MessageId != "routed" {
			t.Fatalf("bound queue got %s", d.MessageId)
		}
		testwait.Until(t, 10*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
		if n := tp.metric(t, "delayproxy_messages_unroutable_total"); n != 0 {
			t.Errorf("unroutable = %v: the alternate exchange took it", n)
		}
	})
}

// TestRelease_MixedDelaysInDueOrder: a few hundred messages with delays
// over 0-3 s arrive in due order and none early, measured on the client,
// with either store (the PostgreSQL one reads ahead of due times).
func TestRelease_MixedDelaysInDueOrder(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		for _, st := range []struct {
			name string
			opt  func(*delayproxy.Config)
		}{
			{"bbolt", nil},
			{"postgres", func(c *delayproxy.Config) { c.Store, c.StoreSchema = teststore.PGURL(), teststore.PGSchema(t) }},
		} {
			t.Run(st.name, func(t *testing.T) { checkMixedDelaysInDueOrder(t, b, st.opt) })
		}
	})
}

func checkMixedDelaysInDueOrder(t *testing.T, b testbroker.Broker, opt func(*delayproxy.Config)) {
	const n = 400
	ch := confirmChannel(t, startProxyOn(t, b, opt).dial(t))
	ex, _, cons := delayedFanoutOn(t, b, ch)

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
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		const n = 300
		tp, ch := startConfirmedOn(t, b)
		ex, q := delayedQueueOn(t, b, ch, "fanout", "")
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
		testwait.Until(t, 10*time.Second, "some releases before the stop", func() bool { return b.QueueDepth(t, q) > 0 })
		before := tp.pending(t, ex)
		tp.restart()
		if before == 0 {
			t.Fatal("nothing was pending at the stop")
		}
		testwait.Until(t, 30*time.Second, "every message to be released", func() bool { return tp.pending(t, ex) == 0 })
		// Every release is confirmed (so enqueued) before it leaves the store.
		got := drainOn(t, b, q)
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
	})
}

// TestRelease_QuorumAndClassicQueues: releases reach quorum and classic
// queues alike.
func TestRelease_QuorumAndClassicQueues(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		_, ch := startConfirmedOn(t, b)
		ex := declareDelayedOn(t, b, ch, "fanout", nil)
		quorum := b.DeclareQueue(t, true, amqp.Table{"x-queue-type": "quorum"})
		classic := b.DeclareQueue(t, true, amqp.Table{"x-queue-type": "classic"})
		bindOn(t, b, quorum, "", ex, nil)
		bindOn(t, b, classic, "", ex, nil)
		qc, cc := consume(t, testbroker.Dial(t, b.URL), quorum), consume(t, testbroker.Dial(t, b.URL), classic)
		for i := range 10 {
			publishConfirmed(t, ch, ex, "", false, delayedMsg(int32(200+10*i), fmt.Sprint(i)))
		}
		want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
		if got := messageIDs(qc.wait(t, 10, 20*time.Second)); !slices.Equal(got, want) {
			t.Errorf("quorum queue got %v", got)
		}
		if got := messageIDs(cc.wait(t, 10, 20*time.Second)); !slices.Equal(got, want) {
			t.Errorf("classic queue got %v", got)
		}
	})
}

// TestDelayed_PublisherAndConsumerThroughProxy: both sides of the delayed
// path connected through the proxy, on one connection and on two.
func TestDelayed_PublisherAndConsumerThroughProxy(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		tp, pubConn := startDialledOn(t, b)
		ch := confirmChannel(t, pubConn)
		ex := declareDelayedOn(t, b, ch, "topic", nil)
		q1, err := ch.QueueDeclare(testbroker.UniqueName(t, "q"), false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.DeleteQueue(t, q1.Name) })
		q2 := b.DeclareQueue(t, true, nil)
		if err := ch.QueueBind(q1.Name, "a.#", ex, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q2, "#.b", ex, false, nil); err != nil {
			t.Fatal(err)
		}
		same := consume(t, pubConn, q1.Name) // the publisher's own connection
		other := consume(t, tp.dial(t), q2)  // another proxied connection
		// "both" is published first and due 500 ms after "a-only": the order
		// holds unless the first confirm takes longer than that (CI under
		// -race has taken over 100 ms).
		start := time.Now().Round(0)
		publishConfirmed(t, ch, ex, "a.b", false, delayedMsg(int32(800), "both"))
		publishConfirmed(t, ch, ex, "a.x", false, delayedMsg(int32(300), "a-only"))
		if got := messageIDs(same.wait(t, 2, 20*time.Second)); !slices.Equal(got, []string{"a-only", "both"}) {
			t.Errorf("same connection got %v", got)
		}
		got := other.wait(t, 1, 20*time.Second)
		if got[0].MessageId != "both" || got[0].At.Before(start.Add(800*time.Millisecond)) {
			t.Errorf("other connection got %s at +%v", got[0].MessageId, got[0].At.Sub(start))
		}
	})
}

// TestRelease_BurstSameMillisecondByPriority: messages all due at the same
// millisecond, with priorities 0-9, arrive highest priority first and in
// publish order within a priority (a plain classic queue keeps arrival
// order). 20,000 here; the 100,000 version is TestFaultBurst100k (build tag
// brokerfaults), since it takes over a minute with -race.
func TestRelease_BurstSameMillisecondByPriority(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		testBurst(t, b, 20_000)
	})
}

// testBurst publishes n messages through a proxy in front of broker b that
// are all due at one millisecond, and checks their release order.
//
// The proxy computes due = its clock + x-delay when it reads a publish, so a
// client cannot give thousands of publishes one due millisecond on its own:
// the proxy's clock is frozen while they are sent, with x-delay one hour.
// Four publishers send them in one transaction each. Then the clock jumps
// forward to just before the due time: the scheduler loads them from disk
// into one wheel slot, which fires with all of them in it, however long
// publishing took.
func testBurst(t *testing.T, b testbroker.Broker, n int) {
	const (
		publishers = 4
		delay      = time.Hour
	)
	clock := &testClock{}
	tp := startProxyWith(t, upstream(b, nil), testlog.For(t), delayproxy.WithClock(clock))
	var chans [publishers]*amqp.Channel
	for p := range chans {
		chans[p] = testbroker.Channel(t, tp.dial(t))
		if err := chans[p].Tx(); err != nil {
			t.Fatal(err)
		}
	}
	ex, q := delayedQueueOn(t, b, chans[0], "direct", "k") // q: classic, no x-max-priority: arrival order is kept
	cons := consume(t, testbroker.Dial(t, b.URL), q)

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
	releasing := time.Now()
	got := cons.drain(t, n, 30*time.Second) // the pace is the machine's: only a stall fails
	t.Logf("%d released and consumed in %v", n, time.Since(releasing))
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
	testwait.Until(t, 30*time.Second, "pending to drop to 0", func() bool { return tp.pending(t, ex) == 0 })
	if rest := cons.stop(t); len(rest) != n {
		t.Fatalf("%d deliveries, want %d", len(rest), n)
	}
	releasedIn := clock.at(got[len(got)-1].At).Sub(due)
	t.Logf("all %d arrived within %v of the due time (%.0f msg/s); the first %v after it",
		n, releasedIn, float64(n)/releasedIn.Seconds(), clock.at(got[0].At).Sub(due))
}
