package amqpproxy

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// Every test here runs amqp091-go through the proxy against the real
// RabbitMQ, on each broker (3.10 and 4.3). What RabbitMQ itself does with
// messages (delivery counts, dead-lettering, TTL, priorities) is checked
// against direct in brokerbehaviour_test.go.

func publish(t testing.TB, ch *amqp.Channel, exchange, key string, m amqp.Publishing) {
	t.Helper()
	if err := ch.PublishWithContext(ctxTimeout(t, 10*time.Second), exchange, key, false, false, m); err != nil {
		t.Fatal(err)
	}
}

// confirmedPublish publishes on a channel in confirm mode and waits for the
// broker's answer, which it returns.
func confirmedPublish(t testing.TB, ch *amqp.Channel, exchange, key string, mandatory bool, m amqp.Publishing) bool {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, m)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// relayedQueue is where most tests here start: a proxy in front of b, a
// queue declared straight on b (deleted in t.Cleanup), and a channel
// through the proxy on a connection dialled with cfg.
func relayedQueue(t testing.TB, b testbroker.Broker, cfg amqp.Config) (string, *amqp.Channel) {
	t.Helper()
	p := startProxyOn(t, b, Config{})
	q := b.DeclareQueue(t, false, nil)
	return q, testbroker.Channel(t, p.dial(t, cfg))
}

// next receives one delivery or fails.
func next(t testing.TB, msgs <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
	}
	panic("unreachable")
}

// wantReturned fails the test unless returns already holds a basic.return
// (312 NO_ROUTE); none is the failure when it holds nothing.
func wantReturned(t testing.TB, returns <-chan amqp.Return, none string) {
	t.Helper()
	select {
	case r := <-returns:
		if r.ReplyCode != 312 {
			t.Fatalf("return %+v", r)
		}
	default:
		t.Fatal(none)
	}
}

// get polls basic.get (auto-ack or not) until a message arrives.
func get(t testing.TB, ch *amqp.Channel, q string, autoAck bool) amqp.Delivery {
	t.Helper()
	var d amqp.Delivery
	testwait.Until(t, 10*time.Second, "a message in "+q, func() bool {
		var ok bool
		var err error
		d, ok, err = ch.Get(q, autoAck)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	return d
}

func TestPublishConsumeAck(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		q, ch := relayedQueue(t, b, amqp.Config{})
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if !confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte{byte('a' + i)}, DeliveryMode: amqp.Persistent}) {
				t.Fatal("nack")
			}
		}
		msgs, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			m := next(t, msgs)
			if string(m.Body) != string(rune('a'+i)) || m.DeliveryMode != amqp.Persistent {
				t.Fatalf("got %q mode %d", m.Body, m.DeliveryMode)
			}
			if err := m.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil || n.Messages != 0 {
			t.Fatalf("after acks: %+v %v", n, err)
		}
	})
}

// TestConfirmsMany publishes a burst without waiting, so that RabbitMQ
// answers with multiple acks, and checks every tag is acked once, in order.
func TestConfirmsMany(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		q, ch := relayedQueue(t, b, amqp.Config{})
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		const n = 3000
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
		ctx := ctxTimeout(t, 20*time.Second)
		for i := range n {
			if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			select {
			case c := <-confirms:
				if !c.Ack || c.DeliveryTag != uint64(i+1) {
					t.Fatalf("confirm %d: %+v", i, c)
				}
			case <-ctx.Done():
				t.Fatalf("%d of %d confirms", i, n)
			}
		}
		if st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil || st.Messages != n {
			t.Fatalf("queue holds %d (%v)", st.Messages, err)
		}
	})
}

// TestMandatoryReturnBeforeAck: an unroutable mandatory publish comes back
// as basic.return 312 NO_ROUTE, before its ack, on the wire.
func TestMandatoryReturnBeforeAck(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		c := rawDial(t, p.addr)
		c.open(rawLogin{})
		c.send(1, &wire.ChannelOpen{})
		c.expect(1, wire.IDChannelOpenOk)
		c.send(1, &wire.ConfirmSelect{})
		c.expect(1, wire.IDConfirmSelectOk)
		key := testbroker.UniqueName(t, "q")
		for range 2 {
			c.send(1, &wire.BasicPublish{Exchange: "amq.direct", RoutingKey: key, Mandatory: true})
			c.header(1, 5)
			c.frame(wire.FrameBody, 1, []byte("hello"))
		}
		for tag := uint64(1); tag <= 2; tag++ {
			ret := c.expect(1, wire.IDBasicReturn).(*wire.BasicReturn)
			if ret.ReplyCode != wire.NoRoute || ret.ReplyText != "NO_ROUTE" || ret.RoutingKey != key {
				t.Fatalf("return %+v", ret)
			}
			if f, _, err := c.next(); err != nil || f.Type != wire.FrameHeader {
				t.Fatalf("want the returned header: %v %v", f, err)
			}
			if f, _, err := c.next(); err != nil || string(f.Payload) != "hello" {
				t.Fatalf("want the returned body: %v %v", f, err)
			}
			ack := c.expect(1, wire.IDBasicAck).(*wire.BasicAck)
			if ack.DeliveryTag != tag {
				t.Fatalf("ack %+v, want tag %d", ack, tag)
			}
		}

		// The same through amqp091-go.
		ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		if !confirmedPublish(t, ch, "amq.direct", key, true, amqp.Publishing{Body: []byte("x")}) {
			t.Fatal("nack")
		}
		wantReturned(t, returns, "ack came before the return")
	})
}

func TestTxCommitRollback(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		q, ch := relayedQueue(t, b, amqp.Config{})
		if err := ch.Tx(); err != nil {
			t.Fatal(err)
		}
		publish(t, ch, "", q, amqp.Publishing{Body: []byte("rolled back")})
		if err := ch.TxRollback(); err != nil {
			t.Fatal(err)
		}
		publish(t, ch, "", q, amqp.Publishing{Body: []byte("committed")})
		if err := ch.TxCommit(); err != nil {
			t.Fatal(err)
		}
		st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil || st.Messages != 1 {
			t.Fatalf("queue holds %d (%v), want 1", st.Messages, err)
		}
		if d := get(t, ch, q, true); string(d.Body) != "committed" {
			t.Fatalf("got %q", d.Body)
		}
		// tx and confirm mode exclude each other: 406 from RabbitMQ.
		err = ch.Confirm(false)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			t.Fatalf("confirm.select in tx mode: %v", err)
		}
	})
}

func TestBasicGetPurgeRecover(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		q, ch := relayedQueue(t, b, amqp.Config{})
		if _, ok, err := ch.Get(q, false); err != nil || ok {
			t.Fatalf("get on an empty queue: %v %v", ok, err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: []byte("m"), Headers: amqp.Table{"k": "v", "n": int32(7)}})
		}
		d, ok, err := ch.Get(q, false)
		if err != nil || !ok || d.MessageCount != 2 || d.Headers["k"] != "v" || d.Headers["n"] != int32(7) {
			t.Fatalf("get: %v %v %+v", ok, err, d)
		}
		//lint:ignore SA1019 basic.recover is deprecated but RabbitMQ still serves it: the proxy relays it
		if err := ch.Recover(true); err != nil { // the unacked message goes back
			t.Fatal(err)
		}
		if err := ch.Qos(10, 0, false); err != nil {
			t.Fatal(err)
		}
		n, err := ch.QueuePurge(q, false)
		if err != nil || n != 3 {
			t.Fatalf("purge: %d %v", n, err)
		}
		if n, err := ch.QueueDelete(q, false, false, false); err != nil || n != 0 {
			t.Fatalf("delete: %d %v", n, err)
		}
	})
}

func TestExclusiveAndAutoDeleteQueues(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		a := testbroker.Channel(t, p.dial(t, amqp.Config{}))
		excl, err := a.QueueDeclare("", false, false, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		other := testbroker.Channel(t, p.dial(t, amqp.Config{}))
		_, err = other.QueueDeclarePassive(excl.Name, false, false, true, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.ResourceLocked {
			t.Fatalf("other connection on an exclusive queue: %v", err)
		}
		auto := testbroker.UniqueName(t, "q")
		if _, err := a.QueueDeclare(auto, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Consume(auto, "c1", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := a.Cancel("c1", false); err != nil {
			t.Fatal(err)
		}
		c := testbroker.Channel(t, p.dial(t, amqp.Config{}))
		testwait.Until(t, 5*time.Second, "the auto-delete queue to go", func() bool {
			_, err := c.QueueDeclarePassive(auto, false, true, false, false, nil)
			if err == nil {
				return false
			}
			if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
				t.Fatalf("passive declare: %v", err)
			}
			c = testbroker.Channel(t, p.dial(t, amqp.Config{}))
			return true
		})
	})
}

func TestExchangeToExchangeBinding(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
		src, dst := testbroker.UniqueName(t, "q"), testbroker.UniqueName(t, "q")
		for _, e := range []struct{ name, kind string }{{src, "fanout"}, {dst, "direct"}} {
			if err := ch.ExchangeDeclare(e.name, e.kind, false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.DeleteExchange(t, e.name) })
		}
		q := b.DeclareQueue(t, false, nil)
		if err := ch.QueueBind(q, "k", dst, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.ExchangeBind(dst, "", src, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		returns := ch.NotifyReturn(make(chan amqp.Return, 2))
		confirmedPublish(t, ch, src, "k", true, amqp.Publishing{Body: []byte("via e2e")})
		if d := get(t, ch, q, true); string(d.Body) != "via e2e" {
			t.Fatalf("got %q", d.Body)
		}
		if err := ch.ExchangeUnbind(dst, "", src, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueUnbind(q, "k", dst, nil); err != nil {
			t.Fatal(err)
		}
		confirmedPublish(t, ch, src, "k", true, amqp.Publishing{Body: []byte("nowhere")})
		wantReturned(t, returns, "unbound publish was not returned")
		for _, e := range []string{src, dst} {
			if err := ch.ExchangeDelete(e, false, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.ExchangeDeclarePassive(dst, "direct", false, false, false, false, nil); err == nil {
			t.Fatal("exchange still there after exchange.delete")
		}
	})
}

// TestChannelErrorClosesOnlyThatChannel: 404 on a missing queue closes the
// channel; the connection and its other channels go on.
func TestChannelErrorClosesOnlyThatChannel(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		conn := p.dial(t, amqp.Config{})
		bad, good := testbroker.Channel(t, conn), testbroker.Channel(t, conn)
		closed := bad.NotifyClose(make(chan *amqp.Error, 1))
		_, err := bad.QueueDeclarePassive(testbroker.UniqueName(t, "q"), false, false, false, false, nil)
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			t.Fatalf("passive declare of a missing queue: %v", err)
		}
		if e := <-closed; e == nil || e.Code != amqp.NotFound {
			t.Fatalf("channel closed with %v", e)
		}
		q := b.DeclareQueue(t, false, nil)
		if _, err := good.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		again := testbroker.Channel(t, conn) // the freed number is reused
		if _, err := again.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if conn.IsClosed() {
			t.Fatal("connection closed")
		}
	})
}

// TestConsumerCancelNotify: deleting a queue cancels its consumers with
// basic.cancel from the server.
func TestConsumerCancelNotify(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		q, ch := relayedQueue(t, b, amqp.Config{})
		cancels := ch.NotifyCancel(make(chan string, 1))
		if _, err := ch.Consume(q, "the-consumer", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		b.DeleteQueue(t, q)
		select {
		case tag := <-cancels:
			if tag != "the-consumer" {
				t.Fatalf("cancelled %q", tag)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no basic.cancel")
		}
	})
}

// TestLargeBodySmallFrames: a 10 MiB body with frame_max 8192 (4.3's
// minimum) on the client; both hops use the client's frame_max.
func TestLargeBodySmallFrames(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		q, ch := relayedQueue(t, b, amqp.Config{FrameSize: 8192})
		body := make([]byte, 10<<20)
		for i := range body {
			body[i] = byte(i * 7)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		if !confirmedPublish(t, ch, "", q, false, amqp.Publishing{Body: body}) {
			t.Fatal("nack")
		}
		d := get(t, ch, q, true)
		if !bytes.Equal(d.Body, body) {
			t.Fatalf("body of %d bytes differs", len(d.Body))
		}
	})
}

// TestHeartbeatsKeepIdleConnection: with a 1 s heartbeat, an idle
// connection stays up for more than three intervals.
func TestHeartbeatsKeepIdleConnection(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		q := b.DeclareQueue(t, false, nil)
		conn := p.dial(t, amqp.Config{Heartbeat: time.Second})
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		ch := testbroker.Channel(t, conn)
		select {
		case e := <-closed:
			t.Fatalf("idle connection closed: %v", e)
		case <-time.After(3500 * time.Millisecond):
		}
		publish(t, ch, "", q, amqp.Publishing{Body: []byte("still here")})
		if d := get(t, ch, q, true); string(d.Body) != "still here" {
			t.Fatalf("got %q", d.Body)
		}
	})
}

func TestChannelFlowRelayed(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		conn := p.dial(t, amqp.Config{})
		ch := testbroker.Channel(t, conn)
		if err := ch.Flow(true); err != nil {
			t.Fatal(err)
		}
		// RabbitMQ answers active=false with 540 NOT_IMPLEMENTED: relayed, not emulated.
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		ch.Flow(false)
		if e := testbroker.AwaitClose(t, closed, 10*time.Second); e.Code != amqp.NotImplemented {
			t.Fatalf("closed with %v", e)
		}
	})
}

func TestAMQPLAIN(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		conn := p.dial(t, amqp.Config{SASL: []amqp.Authentication{&amqp.AMQPlainAuth{Username: "guest", Password: "guest"}}})
		if _, err := testbroker.Channel(t, conn).QueueDeclare("", false, true, true, false, nil); err != nil {
			t.Fatal(err)
		}
	})
}
