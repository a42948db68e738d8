package amqpproxy

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// TestInterceptDeclareRewriteHeldReply: exchange.declare of type
// x-delayed-message goes upstream as its x-delayed-type; the declare-ok is
// held by the hook (as a store write would) and then passed. Invalid
// declares are refused by the proxy with 406 and RabbitMQ's wording.
func TestInterceptDeclareRewriteHeldReply(t *testing.T) {
	t.Parallel()
	var held atomic.Int32
	hooks := &testHooks{methods: []wire.MethodID{wire.IDExchangeDeclare}}
	hooks.method = func(c *Call) {
		m := c.Method.(*wire.ExchangeDeclare)
		if m.Type != "x-delayed-message" {
			c.Relay(nil, nil)
			return
		}
		typ, ok, _ := m.Arguments.Get("x-delayed-type")
		s, isString := typ.(string)
		if !ok || !isString {
			c.CloseChannel(wire.PreconditionFailed, "Invalid argument, 'x-delayed-type' must be an existing exchange type")
			return
		}
		rewritten := *m
		rewritten.Type = s
		c.Relay(&rewritten, func(r *Reply) {
			if r.Err != nil {
				r.Pass()
				return
			}
			hooks.later(100*time.Millisecond, func() {
				held.Add(1)
				r.Pass()
			})
		})
	}
	p := startProxy(t, Config{Interceptor: hooks})
	conn := p.dial(t, amqp.Config{})
	ch := testbroker.Channel(t, conn)
	name := testbroker.UniqueName(t, "q")
	t.Cleanup(func() { testbroker.DeleteExchange(t, name) })
	start := time.Now()
	if err := ch.ExchangeDeclare(name, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "topic"}); err != nil {
		t.Fatal(err)
	}
	if held.Load() != 1 || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("declare-ok reached the client before the hook passed it (%v)", time.Since(start))
	}
	if out := testbroker.Ctl(t, "list_exchanges", "name", "type"); !strings.Contains(out, name+"\ttopic") {
		t.Fatalf("exchange %s is not a topic exchange upstream:\n%s", name, out)
	}
	// The same channel goes on: a plain declare passes through.
	if err := ch.ExchangeDeclarePassive(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	// Missing x-delayed-type: 406 from the proxy, channel closed, connection fine.
	bad := testbroker.Channel(t, conn)
	closedCh := bad.NotifyClose(make(chan *amqp.Error, 1))
	err := bad.ExchangeDeclare(testbroker.UniqueName(t, "q"), "x-delayed-message", true, false, false, false, nil)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed ||
		ae.Reason != "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type" {
		t.Fatalf("declare without x-delayed-type: %v", err)
	}
	if e := <-closedCh; e == nil || e.Code != amqp.PreconditionFailed {
		t.Fatalf("channel closed with %v", e)
	}
	again := testbroker.Channel(t, conn) // reuses the number the proxy closed
	if err := again.ExchangeDeclarePassive(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if conn.IsClosed() {
		t.Fatal("connection closed")
	}
	hooks.wg.Wait()
}

// TestInterceptNoWaitMadeSync: a no-wait declare made synchronous by the
// hook, its declare-ok dropped late; the client's next synchronous request
// still gets its own answer.
func TestInterceptNoWaitMadeSync(t *testing.T) {
	t.Parallel()
	var dropped atomic.Int32
	hooks := &testHooks{methods: []wire.MethodID{wire.IDExchangeDeclare}}
	hooks.method = func(c *Call) {
		m := *c.Method.(*wire.ExchangeDeclare)
		m.NoWait = false
		c.Relay(&m, func(r *Reply) {
			hooks.later(50*time.Millisecond, func() {
				if r.Err == nil && r.Method.ID() == wire.IDExchangeDeclareOk {
					dropped.Add(1)
				}
				r.Drop()
			})
		})
	}
	p := startProxy(t, Config{Interceptor: hooks})
	ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
	name := testbroker.UniqueName(t, "q")
	t.Cleanup(func() { testbroker.DeleteExchange(t, name) })
	if err := ch.ExchangeDeclare(name, "fanout", false, false, false, true, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil || !strings.HasPrefix(q.Name, "amq.gen-") {
		t.Fatalf("queue.declare after the held no-wait declare: %+v %v", q, err)
	}
	if err := ch.QueueBind(q.Name, "", name, false, nil); err != nil {
		t.Fatal(err)
	}
	hooks.wg.Wait()
	if dropped.Load() != 1 {
		t.Fatalf("%d declare-oks dropped", dropped.Load())
	}
}

// TestInterceptAnswerLocally: a hook answers queue.declare itself, in turn
// with the channel's other replies.
func TestInterceptAnswerLocally(t *testing.T) {
	t.Parallel()
	hooks := &testHooks{methods: []wire.MethodID{wire.IDQueueDeclare}}
	hooks.method = func(c *Call) {
		if m := c.Method.(*wire.QueueDeclare); m.Queue == "local-answer" {
			c.Answer(&wire.QueueDeclareOk{Queue: m.Queue, MessageCount: 42, ConsumerCount: 7})
			return
		}
		c.Relay(nil, nil)
	}
	p := startProxy(t, Config{Interceptor: hooks})
	ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
	q, err := ch.QueueDeclare("local-answer", false, false, false, false, nil)
	if err != nil || q.Messages != 42 || q.Consumers != 7 {
		t.Fatalf("local answer: %+v %v", q, err)
	}
	real, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil || !strings.HasPrefix(real.Name, "amq.gen-") {
		t.Fatalf("relayed declare: %+v %v", real, err)
	}
}

// TestInterceptTxGating: taken-over publishes of a transaction are kept by
// the hook and stored at tx.commit, whose commit-ok waits for the store;
// tx.rollback drops them.
func TestInterceptTxGating(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var inTx, stored []string
	hooks := &testHooks{methods: []wire.MethodID{wire.IDTxCommit, wire.IDTxRollback}}
	hooks.intercepts = func(ch *Channel, m *wire.BasicPublish) bool { return m.Exchange == "delayed" }
	hooks.publish = func(p *Publish) {
		if !p.Channel.TxMode() || p.Claim != "delayed" {
			p.CloseChannel(wire.PreconditionFailed, fmt.Sprintf("test wants tx mode and InterceptsPublish's claim, got %v", p.Claim))
			return
		}
		mu.Lock()
		inTx = append(inTx, string(p.Body))
		mu.Unlock()
		p.Ack() // marks it done; nothing is sent outside confirm mode
	}
	hooks.method = func(c *Call) {
		mu.Lock()
		batch := inTx
		inTx = nil
		mu.Unlock()
		if c.Method.ID() == wire.IDTxRollback {
			c.Relay(nil, nil)
			return
		}
		c.Relay(nil, func(r *Reply) {
			hooks.later(80*time.Millisecond, func() { // the store's commit
				mu.Lock()
				stored = append(stored, batch...)
				mu.Unlock()
				r.Pass()
			})
		})
	}
	p := startProxy(t, Config{Interceptor: hooks})
	q := testbroker.DeclareQueue(t, false, nil)
	ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	publish(t, ch, "delayed", "k", amqp.Publishing{Body: []byte("dropped")})
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("relayed, rolled back")})
	if err := ch.TxRollback(); err != nil {
		t.Fatal(err)
	}
	publish(t, ch, "delayed", "k", amqp.Publishing{Body: []byte("kept")})
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("relayed, committed")})
	start := time.Now()
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 80*time.Millisecond {
		t.Fatalf("commit-ok after %v: it did not wait for the store", d)
	}
	mu.Lock()
	got := strings.Join(stored, ",")
	mu.Unlock()
	if got != "kept" {
		t.Fatalf("stored %q, want kept", got)
	}
	if d := get(t, ch, q, true); string(d.Body) != "relayed, committed" {
		t.Fatalf("queue has %q", d.Body)
	}
	hooks.wg.Wait()
}

// TestInterceptCloseChannelMidContent: the proxy closes a channel (from
// another goroutine) while a large publish on it is being relayed frame by
// frame. The channel.close must not land between the publish's frames
// upstream (RabbitMQ would close the whole connection with 505).
func TestInterceptCloseChannelMidContent(t *testing.T) {
	t.Parallel()
	hooks := &testHooks{}
	var closedOnce atomic.Bool
	hooks.intercepts = func(ch *Channel, m *wire.BasicPublish) bool {
		if m.RoutingKey == "big" && closedOnce.CompareAndSwap(false, true) {
			hooks.later(time.Millisecond, func() { ch.CloseChannel(wire.ResourceError, "store full") })
		}
		return false // relayed frame by frame
	}
	p := startProxy(t, Config{Interceptor: hooks})
	q := testbroker.DeclareQueue(t, false, nil)
	conn := p.dial(t, amqp.Config{FrameSize: 4096})
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch := testbroker.Channel(t, conn)
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	body := make([]byte, 8<<20)
	publish(t, ch, "", "big", amqp.Publishing{Body: body})
	select {
	case e := <-chClosed:
		if e == nil || e.Code != amqp.ResourceError || e.Reason != "RESOURCE_ERROR - store full" {
			t.Fatalf("channel closed with %v", e)
		}
	case e := <-connClosed:
		t.Fatalf("connection closed: %v", e)
	case <-time.After(20 * time.Second):
		t.Fatal("channel not closed")
	}
	ch2 := testbroker.Channel(t, conn)
	publish(t, ch2, "", q, amqp.Publishing{Body: []byte("after")})
	if d := get(t, ch2, q, true); string(d.Body) != "after" {
		t.Fatalf("got %q", d.Body)
	}
	hooks.wg.Wait()
}

// TestInterceptPublishCloseChannel: a taken-over publish refused with a
// channel error (the x-delay that is not a number); no confirm is sent.
func TestInterceptPublishCloseChannel(t *testing.T) {
	t.Parallel()
	hooks := &testHooks{}
	hooks.intercepts = func(ch *Channel, m *wire.BasicPublish) bool { return m.Exchange == "" && m.RoutingKey == "bad" }
	hooks.publish = func(p *Publish) {
		p.CloseChannel(wire.PreconditionFailed, "invalid x-delay header 'abc': not a number")
	}
	p := startProxy(t, Config{Interceptor: hooks})
	conn := p.dial(t, amqp.Config{})
	ch := testbroker.Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	ctx := ctxTimeout(t, 10*time.Second)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "bad", false, false, amqp.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	e := <-chClosed
	if e == nil || e.Code != amqp.PreconditionFailed || !strings.Contains(e.Reason, "x-delay") {
		t.Fatalf("channel closed with %v", e)
	}
	if ack, err := dc.WaitContext(ctx); err == nil && ack {
		t.Fatal("refused publish was acked")
	}
	if conn.IsClosed() {
		t.Fatal("connection closed")
	}
}

// TestInterceptAssembledMalformed: when the proxy assembles a publish it
// judges broken content itself, with RabbitMQ's codes.
func TestInterceptAssembledMalformed(t *testing.T) {
	t.Parallel()
	hooks := &testHooks{intercepts: func(*Channel, *wire.BasicPublish) bool { return true }}
	p := startProxy(t, Config{Interceptor: hooks})
	for _, tc := range malformedCases {
		switch tc.name {
		case "method in the middle of a content", "content header of another class", "truncated basic.publish":
		default:
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkMalformed(t, p.addr, tc.code, tc.send)
		})
	}
	t.Run("body frame longer than the content", func(t *testing.T) {
		t.Parallel()
		checkMalformed(t, p.addr, wire.FrameError, func(c *rawClient) {
			c.send(1, &wire.ChannelOpen{})
			c.send(1, &wire.BasicPublish{Exchange: "amq.direct"})
			c.header(1, 3)
			c.frame(wire.FrameBody, 1, []byte("hello"))
		})
	})
	t.Run("message larger than max", func(t *testing.T) {
		t.Parallel()
		small := startProxy(t, Config{Interceptor: hooks, MaxMessageSize: 1000})
		c := rawDial(t, small.addr)
		c.open(rawLogin{})
		c.send(1, &wire.ChannelOpen{})
		c.expect(1, wire.IDChannelOpenOk)
		c.send(1, &wire.BasicPublish{Exchange: "amq.direct"})
		c.header(1, 2000)
		c.frame(wire.FrameBody, 1, make([]byte, 2000))
		cm := c.expect(1, wire.IDChannelClose).(*wire.ChannelClose)
		if cm.ReplyCode != wire.PreconditionFailed || cm.ReplyText != "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000" {
			t.Fatalf("close %+v", cm)
		}
		c.send(1, &wire.ChannelCloseOk{})
		c.send(1, &wire.ChannelOpen{}) // the number is free again
		c.expect(1, wire.IDChannelOpenOk)
	})
}

// TestInterceptLifecycle: Open and Closed are called once per connection;
// a reply hook still waiting when the connection ends is told so.
func TestInterceptLifecycle(t *testing.T) {
	t.Parallel()
	replyErr := make(chan error, 1)
	hooks := &testHooks{methods: []wire.MethodID{wire.IDQueueDeclare}}
	hooks.method = func(c *Call) {
		c.Relay(nil, func(r *Reply) { replyErr <- r.Err; r.Pass() })
	}
	p := startProxy(t, Config{Interceptor: hooks})
	c := rawDial(t, p.addr)
	c.open(rawLogin{})
	c.send(1, &wire.ChannelOpen{})
	c.expect(1, wire.IDChannelOpenOk)
	c.send(1, &wire.QueueDeclare{Queue: testbroker.UniqueName(t, "q"), Passive: true}) // 404 closes the channel
	cm := c.expect(1, wire.IDChannelClose).(*wire.ChannelClose)
	if cm.ReplyCode != wire.NotFound {
		t.Fatalf("close %+v", cm)
	}
	var e *wire.Error
	if err := <-replyErr; !errors.As(err, &e) || e.Code != wire.NotFound {
		t.Fatalf("reply hook told %v", err)
	}
	c.send(1, &wire.ChannelCloseOk{})
	c.send(0, &wire.ConnectionClose{ReplyCode: 200})
	c.expect(0, wire.IDConnectionCloseOk)
	testwait.Until(t, 5*time.Second, "Closed", func() bool { return hooks.closed.Load() == 1 })
	if hooks.opened.Load() != 1 {
		t.Fatalf("Open called %d times", hooks.opened.Load())
	}
}

// TestInterceptRelayAssembled: assembled publishes relayed by the hook keep
// their bytes (properties and headers included); a large body is re-split
// at the upstream frame_max, an empty one goes as a header alone.
func TestInterceptRelayAssembled(t *testing.T) {
	t.Parallel()
	var seen atomic.Int32
	hooks := &testHooks{intercepts: func(*Channel, *wire.BasicPublish) bool { return true }}
	hooks.publish = func(p *Publish) {
		seen.Add(1)
		p.Relay()
	}
	p := startProxy(t, Config{Interceptor: hooks})
	q := testbroker.DeclareQueue(t, false, nil)
	ch := testbroker.Channel(t, p.dial(t, amqp.Config{FrameSize: 4096}))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20+17)
	for i := range big {
		big[i] = byte(i % 251)
	}
	for _, body := range [][]byte{big, nil, []byte("small")} {
		m := amqp.Publishing{Body: body, Headers: amqp.Table{"x-delay": int32(5000), "nested": amqp.Table{"a": "b"}},
			ContentType: "application/octet-stream", MessageId: "id-1", Priority: 3}
		if !confirmedPublish(t, ch, "", q, false, m) {
			t.Fatal("nack")
		}
		d := get(t, ch, q, true)
		if !bytes.Equal(d.Body, body) || d.Headers["x-delay"] != int32(5000) || d.ContentType != m.ContentType || d.MessageId != "id-1" || d.Priority != 3 {
			t.Fatalf("relayed message differs: %d bytes, %+v", len(d.Body), d.Headers)
		}
	}
	if seen.Load() != 3 {
		t.Fatalf("hook saw %d publishes", seen.Load())
	}
}
