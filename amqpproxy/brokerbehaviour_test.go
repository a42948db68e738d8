package amqpproxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// brokerBehaviour is one thing RabbitMQ itself does with messages or
// declares, which the proxy must pass through unchanged: run observes it on
// a connection to url (the broker, or the proxy in front of it) and says
// what it saw; want is what each broker shows, by Broker.Name.
type brokerBehaviour struct {
	name string
	run  func(t *testing.T, r behaviourRun) string
	want map[string]string
}

// behaviourRun is where one observation runs: a connection to url, on
// broker b.
type behaviourRun struct {
	b   testbroker.Broker
	url string
}

// onBoth is the expectation of a behaviour that 3.10 and 4.3 share.
func onBoth(s string) map[string]string { return map[string]string{"3.10": s, "4.3": s} }

// TestBrokerBehaviourRelayed: what RabbitMQ does with messages and declares
// (delivery counts, dead-lettering, TTL, priorities, queue modes, refusals)
// reaches a client through the proxy exactly as it does straight from
// RabbitMQ, on 3.10 and on 4.3, which differ in places. Every case runs
// direct and through the proxy, against the same expectation.
func TestBrokerBehaviourRelayed(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		for _, bb := range brokerBehaviours {
			want, ok := bb.want[b.Name]
			if !ok {
				t.Fatalf("%s: no expectation for RabbitMQ %s", bb.name, b.Name)
			}
			for _, via := range []struct{ name, url string }{{"direct", b.URL}, {"proxy", p.url(t)}} {
				t.Run(bb.name+"/"+via.name, func(t *testing.T) {
					t.Parallel()
					if got := bb.run(t, behaviourRun{b: b, url: via.url}); got != want {
						t.Errorf("RabbitMQ %s, %s:\n got: %s\nwant: %s", b.Name, via.name, got, want)
					}
				})
			}
		}
	})
}

var brokerBehaviours = []brokerBehaviour{
	{
		// x-delivery-count of each basic.get of one message, requeued by
		// reject, reject, nack, nack, reject.
		name: "quorum x-delivery-count",
		run:  quorumDeliveryCounts,
		want: map[string]string{"3.10": "0 1 2 3 4 5", "4.3": "- 1 2 2 2 3"},
	},
	{
		name: "quorum default delivery limit, reject",
		run:  func(t *testing.T, r behaviourRun) string { return quorumRequeueLoop(t, r, nil, false) },
		want: map[string]string{
			"3.10": "25 deliveries (last x-delivery-count 24), not dead-lettered",
			"4.3":  "21 deliveries (last x-delivery-count 20), dead-lettered: delivery_limit",
		},
	},
	{
		name: "quorum default delivery limit, nack",
		run:  func(t *testing.T, r behaviourRun) string { return quorumRequeueLoop(t, r, nil, true) },
		want: map[string]string{
			"3.10": "25 deliveries (last x-delivery-count 24), not dead-lettered",
			"4.3":  "25 deliveries (last x-delivery-count -), not dead-lettered",
		},
	},
	{
		name: "quorum x-delivery-limit 2, reject",
		run: func(t *testing.T, r behaviourRun) string {
			return quorumRequeueLoop(t, r, amqp.Table{"x-delivery-limit": int32(2)}, false)
		},
		want: map[string]string{
			"3.10": "3 deliveries (last x-delivery-count 2), dead-lettered: delivery_limit",
			"4.3":  "3 deliveries (last x-delivery-count 2), dead-lettered: delivery_limit",
		},
	},
	{
		name: "dead-letter queue TTL",
		run: func(t *testing.T, r behaviourRun) string {
			return deadLettered(t, r, amqp.Table{"x-message-ttl": int32(50)}, func(ch *amqp.Channel, q string) {
				confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")})
			})
		},
		want: deadLetterWant("expired"),
	},
	{
		name: "dead-letter message TTL",
		run: func(t *testing.T, r behaviourRun) string {
			return deadLettered(t, r, nil, func(ch *amqp.Channel, q string) {
				confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m"), Expiration: "50"})
			})
		},
		want: deadLetterWant("expired"),
	},
	{
		name: "dead-letter x-max-length",
		run: func(t *testing.T, r behaviourRun) string {
			return deadLettered(t, r, amqp.Table{"x-max-length": int32(1)}, func(ch *amqp.Channel, q string) {
				confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")}) // dropped from the head
				confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("second")})
			})
		},
		want: deadLetterWant("maxlen"),
	},
	{
		name: "dead-letter reject",
		run: func(t *testing.T, r behaviourRun) string {
			return deadLettered(t, r, nil, func(ch *amqp.Channel, q string) {
				confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")})
				if err := get(t, ch, q, false).Reject(false); err != nil {
					t.Fatal(err)
				}
			})
		},
		want: deadLetterWant("rejected"),
	},
	{
		name: "dead-letter nack",
		run: func(t *testing.T, r behaviourRun) string {
			return deadLettered(t, r, nil, func(ch *amqp.Channel, q string) {
				confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")})
				if err := get(t, ch, q, false).Nack(false, false); err != nil {
					t.Fatal(err)
				}
			})
		},
		want: deadLetterWant("rejected"),
	},
	{
		name: "TTL queue 10 s, message 100 ms",
		run:  func(t *testing.T, r behaviourRun) string { return expiresAfter(t, r, 10_000, 100) },
		want: onBoth("expired after the smaller TTL"),
	},
	{
		name: "TTL queue 100 ms, message 10 s",
		run:  func(t *testing.T, r behaviourRun) string { return expiresAfter(t, r, 100, 10_000) },
		want: onBoth("expired after the smaller TTL"),
	},
	{
		name: "TTL expiry at the head only",
		run:  expiryAtHead,
		want: onBoth("500 ms on: 2 queued; once the first is taken: the second dead-lettered, expired"),
	},
	{
		// Priorities 1, none, 9, 5, 3 published in that order: 9 counts
		// as 5 (it comes first by arrival), none as 0.
		name: "x-max-priority 5",
		run: func(t *testing.T, r behaviourRun) string {
			return priorityOrder(t, r, amqp.Table{"x-max-priority": int32(5)})
		},
		want: onBoth("p9:9 p5:5 p3:3 p1:1 none:0"),
	},
	{
		name: "no x-max-priority",
		run:  func(t *testing.T, r behaviourRun) string { return priorityOrder(t, r, nil) },
		want: onBoth("p1:1 none:0 p9:9 p5:5 p3:3"),
	},
	{
		// messages_ram of 100 messages in a lazy and in a default classic
		// queue, then a redeclare of the lazy one without x-queue-mode.
		name: "x-queue-mode lazy",
		run:  lazyQueue,
		want: map[string]string{
			"3.10": "lazy: paged out; redeclare without it: 406 PRECONDITION_FAILED - inequivalent arg 'x-queue-mode' for queue 'Q' in vhost '/': received none but current is the value 'lazy' of type 'longstr'",
			"4.3":  "lazy: like a default queue; redeclare without it: 406 PRECONDITION_FAILED - inequivalent arg 'x-queue-mode' for queue 'Q' in vhost '/': received none but current is the value 'lazy' of type 'longstr'",
		},
	},
	{
		name: "unknown exchange type",
		run:  unknownExchangeType,
		want: map[string]string{
			"3.10": "connection closed: 503 COMMAND_INVALID - unknown exchange type 'x-no-such-type'",
			"4.3":  "channel closed: 406 PRECONDITION_FAILED - unknown exchange type 'x-no-such-type'; the connection stays open",
		},
	},
	{
		// Two consumers on one channel after basic.qos prefetch 10 global.
		name: "basic.qos global",
		run:  globalQos,
		want: map[string]string{
			"3.10": "qos-ok; 10 of 20 delivered: the prefetch is shared",
			"4.3":  "qos-ok; 20 of 20 delivered: the global flag is ignored",
		},
	},
	{
		name: "frame_max 4096",
		run:  frameMax4096,
		want: map[string]string{
			"3.10": "connection.open-ok",
			"4.3":  "socket closed during the handshake", // its minimum is 8192
		},
	},
}

// channel opens a connection to r.url and a channel in confirm mode on it.
func (r behaviourRun) channel(t *testing.T) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn := testbroker.Dial(t, r.url)
	ch := testbroker.Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// queue declares a queue through ch and deletes it on the broker in
// t.Cleanup.
func (r behaviourRun) queue(t *testing.T, ch *amqp.Channel, durable bool, args amqp.Table) string {
	t.Helper()
	name := testbroker.UniqueName(t, "q")
	if _, err := ch.QueueDeclare(name, durable, false, false, false, args); err != nil {
		t.Fatalf("declare queue %v: %v", args, err)
	}
	t.Cleanup(func() { r.b.DeleteQueue(t, name) })
	return name
}

// withDLX is args (which may be nil) and dead-lettering to dlq.
func withDLX(args amqp.Table, dlq string) amqp.Table {
	out := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
	for k, v := range args {
		out[k] = v
	}
	return out
}

// deliveryCount is a delivery's x-delivery-count, "-" when it has none.
func deliveryCount(d amqp.Delivery) string {
	if n, ok := d.Headers["x-delivery-count"]; ok {
		return fmt.Sprint(n)
	}
	return "-"
}

func quorumDeliveryCounts(t *testing.T, r behaviourRun) string {
	_, ch := r.channel(t)
	q := r.queue(t, ch, true, amqp.Table{"x-queue-type": "quorum"})
	confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")})
	var counts []string
	for _, requeue := range []func(amqp.Delivery) error{
		func(d amqp.Delivery) error { return d.Reject(true) },
		func(d amqp.Delivery) error { return d.Reject(true) },
		func(d amqp.Delivery) error { return d.Nack(false, true) },
		func(d amqp.Delivery) error { return d.Nack(false, true) },
		func(d amqp.Delivery) error { return d.Reject(true) },
	} {
		d := get(t, ch, q, false)
		counts = append(counts, deliveryCount(d))
		if err := requeue(d); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(append(counts, deliveryCount(get(t, ch, q, false))), " ")
}

// quorumRequeueLoop consumes one message of a quorum queue (with args)
// and requeues it (by reject, or by nack) each time it comes, up to 25
// deliveries or until it is dead-lettered.
func quorumRequeueLoop(t *testing.T, r behaviourRun, args amqp.Table, nack bool) string {
	const most = 25
	_, ch := r.channel(t)
	dlq := r.queue(t, ch, false, nil)
	qargs := withDLX(args, dlq)
	qargs["x-queue-type"] = "quorum"
	q := r.queue(t, ch, true, qargs)
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := ch.Consume(dlq, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")})
	n, last := 0, "-"
	for n < most {
		select {
		case d := <-msgs:
			n, last = n+1, deliveryCount(d)
			switch {
			case n == most: // kept: the loop ends
			case nack:
				err = d.Nack(false, true)
			default:
				err = d.Reject(true)
			}
			if err != nil {
				t.Fatal(err)
			}
		case d := <-dead:
			return fmt.Sprintf("%d deliveries (last x-delivery-count %s), dead-lettered: %s", n, last, firstDeathReason(d))
		case <-time.After(10 * time.Second):
			t.Fatalf("after %d deliveries: neither delivered again nor dead-lettered in 10 s", n)
		}
	}
	return fmt.Sprintf("%d deliveries (last x-delivery-count %s), not dead-lettered", n, last)
}

// firstDeathReason is the reason of a dead-lettered message's first
// x-death entry.
func firstDeathReason(d amqp.Delivery) string {
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		return fmt.Sprintf("no x-death in %v", d.Headers)
	}
	death, _ := deaths[0].(amqp.Table)
	return fmt.Sprint(death["reason"])
}

// deadLetterWant is how each broker dead-letters a message of queue Q
// for reason: 4.3 adds the x-last-death headers.
func deadLetterWant(reason string) map[string]string {
	common := fmt.Sprintf("body m, x-death [reason %s, count 1, queue Q], x-first-death-reason %s, expiration \"\"; headers: ", reason, reason)
	first := "x-death x-first-death-exchange x-first-death-queue x-first-death-reason"
	return map[string]string{
		"3.10": common + first,
		"4.3":  common + first + " x-last-death-exchange x-last-death-queue x-last-death-reason",
	}
}

// deadLettered declares a queue with args dead-lettering into another,
// runs trigger on it and describes the one message dead-lettered, with the
// queue's name written Q.
func deadLettered(t *testing.T, r behaviourRun, args amqp.Table, trigger func(ch *amqp.Channel, q string)) string {
	_, ch := r.channel(t)
	dlq := r.queue(t, ch, false, nil)
	q := r.queue(t, ch, false, withDLX(args, dlq))
	trigger(ch, q)
	d := get(t, ch, dlq, false)
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) != 1 {
		t.Fatalf("x-death %v", d.Headers["x-death"])
	}
	death, _ := deaths[0].(amqp.Table)
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	qName := func(v any) string { return strings.ReplaceAll(fmt.Sprint(v), q, "Q") }
	return fmt.Sprintf("body %s, x-death [reason %v, count %v, queue %s], x-first-death-reason %v, expiration %q; headers: %s",
		d.Body, death["reason"], death["count"], qName(death["queue"]), d.Headers["x-first-death-reason"], d.Expiration, strings.Join(names, " "))
}

// expiresAfter publishes a message with expiration messageMs to a queue
// with x-message-ttl queueMs and says when it was dead-lettered.
func expiresAfter(t *testing.T, r behaviourRun, queueMs, messageMs int) string {
	_, ch := r.channel(t)
	dlq := r.queue(t, ch, false, nil)
	q := r.queue(t, ch, false, withDLX(amqp.Table{"x-message-ttl": int32(queueMs)}, dlq))
	start := time.Now()
	confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m"), Expiration: fmt.Sprint(messageMs)})
	d := get(t, ch, dlq, false)
	took := time.Since(start)
	smaller, larger := time.Duration(min(queueMs, messageMs))*time.Millisecond, time.Duration(max(queueMs, messageMs))*time.Millisecond
	if reason := firstDeathReason(d); reason != "expired" {
		return "dead-lettered: " + reason
	}
	if took < smaller || took >= larger/2 {
		return fmt.Sprintf("expired after %v", took)
	}
	return "expired after the smaller TTL"
}

// expiryAtHead: a message with a short TTL behind one with a long TTL
// waits, past its TTL, until it reaches the head.
func expiryAtHead(t *testing.T, r behaviourRun) string {
	_, ch := r.channel(t)
	dlq := r.queue(t, ch, false, nil)
	q := r.queue(t, ch, false, withDLX(nil, dlq))
	confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("first"), Expiration: "60000"})
	confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("second"), Expiration: "100"})
	time.Sleep(500 * time.Millisecond)
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, withDLX(nil, dlq))
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok || string(d.Body) != "first" {
		t.Fatalf("get: %q %v %v", d.Body, ok, err)
	}
	dead := get(t, ch, dlq, false)
	return fmt.Sprintf("500 ms on: %d queued; once the first is taken: the %s dead-lettered, %s", st.Messages, dead.Body, firstDeathReason(dead))
}

// priorityOrder publishes priorities 1, none, 9, 5, 3 to a queue with
// args and lists what basic.get returns, as label:priority. (amqp091-go
// sends priority 0 as no priority.)
func priorityOrder(t *testing.T, r behaviourRun, args amqp.Table) string {
	_, ch := r.channel(t)
	q := r.queue(t, ch, false, args)
	for _, m := range []struct {
		label string
		prio  uint8
	}{{"p1", 1}, {"none", 0}, {"p9", 9}, {"p5", 5}, {"p3", 3}} {
		pub := amqp.Publishing{Body: []byte(m.label), Priority: m.prio}
		confirmedPublish(t, ch, "", q, false, pub)
	}
	var got []string
	for range 5 {
		d := get(t, ch, q, false)
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s:%d", d.Body, d.Priority))
	}
	return strings.Join(got, " ")
}

// lazyQueue compares a lazy classic queue with a default one, 100
// persistent messages each, by rabbitmqctl's messages_ram.
func lazyQueue(t *testing.T, r behaviourRun) string {
	const n = 100
	_, ch := r.channel(t)
	lazy := r.queue(t, ch, true, amqp.Table{"x-queue-mode": "lazy"})
	plain := r.queue(t, ch, true, nil)
	for _, q := range []string{lazy, plain} {
		for range n {
			confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m"), DeliveryMode: amqp.Persistent})
		}
	}
	ram := map[string]string{}
	for line := range strings.SplitSeq(r.b.Ctl(t, "list_queues", "name", "messages_ram"), "\n") {
		if name, v, ok := strings.Cut(line, "\t"); ok && (name == lazy || name == plain) {
			ram[name] = strings.TrimSpace(v)
		}
	}
	var mode string
	switch {
	case ram[lazy] == "0" && ram[plain] == fmt.Sprint(n):
		mode = "paged out"
	case ram[lazy] == ram[plain] && ram[plain] != "":
		mode = "like a default queue"
	default:
		mode = fmt.Sprintf("messages_ram %q, a default queue's %q", ram[lazy], ram[plain])
	}
	_, err := ch.QueueDeclare(lazy, true, false, false, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		t.Fatalf("redeclare without x-queue-mode: %v", err)
	}
	return fmt.Sprintf("lazy: %s; redeclare without it: %d %s", mode, ae.Code, strings.ReplaceAll(ae.Reason, lazy, "Q"))
}

// unknownExchangeType declares an exchange of a type RabbitMQ does not
// have and says what closed.
func unknownExchangeType(t *testing.T, r behaviourRun) string {
	conn, ch := r.channel(t)
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.ExchangeDeclare(testbroker.UniqueName(t, "x"), "x-no-such-type", false, true, false, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		t.Fatalf("declare: %v", err)
	}
	select {
	case e := <-connClosed:
		return fmt.Sprintf("connection closed: %d %s", e.Code, e.Reason)
	case <-time.After(time.Second):
	}
	if _, err := testbroker.Channel(t, conn).QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("after the channel closed: %v", err)
	}
	return fmt.Sprintf("channel closed: %d %s; the connection stays open", ae.Code, ae.Reason)
}

// globalQos sets prefetch 10 with global=true and counts what two
// consumers on the channel get of 20 messages they do not ack.
func globalQos(t *testing.T, r behaviourRun) string {
	const n = 20
	_, ch := r.channel(t)
	q := r.queue(t, ch, false, nil)
	for range n {
		confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m")})
	}
	if err := ch.Qos(10, 0, true); err != nil {
		t.Fatalf("basic.qos global: %v", err)
	}
	var all [2]<-chan amqp.Delivery
	for i := range all {
		msgs, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		all[i] = msgs
	}
	got := 0
	for settle := time.After(time.Second); ; {
		select {
		case <-all[0]:
			got++
		case <-all[1]:
			got++
		case <-settle:
			verdict := "the prefetch is shared"
			if got == n {
				verdict = "the global flag is ignored"
			}
			return fmt.Sprintf("qos-ok; %d of %d delivered: %s", got, n, verdict)
		}
	}
}

// frameMax4096 logs in with frame_max 4096 and says how the handshake
// ended.
func frameMax4096(t *testing.T, r behaviourRun) string {
	u, err := url.Parse(r.url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rawamqp.Dial(u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.C.SetDeadline(time.Now().Add(30 * time.Second))
	m, err := c.Handshake(rawamqp.Login{FrameMax: 4096})
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer in 30 s"
	case err != nil:
		return "socket closed during the handshake"
	case m.ID() == wire.IDConnectionOpenOk:
		return "connection.open-ok"
	}
	return fmt.Sprintf("connection.open answered with %#v", m)
}
