package amqpproxy

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// ackStep is one event on a channel as ackFloor sees it: a delivery
// relayed to the client (deliver, get-ok), a settlement from the client
// (with whether settle must call it foldable), or another client method.
type ackStep struct {
	m    wire.Method
	fold bool // settlements: the foldable result wanted
}

func deliver(tag uint64) ackStep {
	return ackStep{m: &wire.BasicDeliver{ConsumerTag: "amq.ctag-1", DeliveryTag: tag}}
}
func ack(tag uint64, fold bool) ackStep {
	return ackStep{m: &wire.BasicAck{DeliveryTag: tag}, fold: fold}
}
func ackUpTo(tag uint64) ackStep {
	return ackStep{m: &wire.BasicAck{DeliveryTag: tag, Multiple: true}}
}

// deliverAll relays tags 1 to n.
func deliverAll(n uint64) []ackStep {
	var s []ackStep
	for tag := uint64(1); tag <= n; tag++ {
		s = append(s, deliver(tag))
	}
	return s
}

func steps(parts ...[]ackStep) []ackStep {
	var s []ackStep
	for _, p := range parts {
		s = append(s, p...)
	}
	return s
}

// run plays the steps on a, failing where settle's answer is not the one
// wanted.
func (a *ackFloor) run(t *testing.T, s []ackStep) {
	t.Helper()
	for i, st := range s {
		id := st.m.ID()
		payload := wire.AppendMethod(nil, st.m)
		switch id {
		case wire.IDBasicDeliver, wire.IDBasicGetOk:
			a.delivery(id, payload)
		case wire.IDBasicAck, wire.IDBasicNack, wire.IDBasicReject:
			if got := a.settle(id, payload); got != st.fold {
				t.Fatalf("step %d (%s %d): foldable %v, want %v", i, id, binary.BigEndian.Uint64(payload[4:]), got, st.fold)
			}
		default:
			a.method(id, payload)
		}
	}
}

func TestAckFloor(t *testing.T) {
	tests := []struct {
		name  string
		steps []ackStep
	}{
		{"in order", steps(deliverAll(3), []ackStep{ack(1, true), ack(2, true), ack(3, true)})},
		{"a tag not relayed yet stops it", steps(deliverAll(1), []ackStep{ack(2, false), deliver(2), ack(1, false), ack(2, false)})},
		{"settled ahead, then the lowest", steps(deliverAll(4), []ackStep{ack(2, false), ack(1, true), ack(3, true), ack(4, true)})},
		{"the lowest moves past all settled ahead", steps(deliverAll(5), []ackStep{ack(3, false), ack(2, false), ack(4, false), ack(1, true), ack(5, true)})},
		{"a settled tag again", steps(deliverAll(3), []ackStep{ack(1, true), ack(1, false), ack(2, true), ack(3, true)})},
		{"nack and reject settle, and do not fold", steps(deliverAll(4), []ackStep{
			{m: &wire.BasicNack{DeliveryTag: 1}}, {m: &wire.BasicReject{DeliveryTag: 2, Requeue: true}}, ack(3, true),
			{m: &wire.BasicNack{DeliveryTag: 4, Requeue: true}}})},
		{"reject has no multiple bit", steps(deliverAll(4), []ackStep{
			{m: &wire.BasicReject{DeliveryTag: 3, Requeue: true}}, ack(1, true), ack(2, true), ack(4, true)})},
		{"multiple settles up to its tag", steps(deliverAll(5), []ackStep{ack(4, false), ackUpTo(2), ack(3, true), ack(5, true)})},
		{"multiple nack settles up to its tag", steps(deliverAll(3), []ackStep{{m: &wire.BasicNack{DeliveryTag: 2, Multiple: true}}, ack(3, true)})},
		{"multiple below the lowest", steps(deliverAll(3), []ackStep{ack(1, true), ack(2, true), ackUpTo(1), ack(3, true)})},
		{"multiple with tag 0 stops it", steps(deliverAll(3), []ackStep{ackUpTo(0), deliver(4), ack(4, false)})},
		{"get-ok is a delivery", []ackStep{{m: &wire.BasicGetOk{DeliveryTag: 1, Exchange: "x", RoutingKey: "k", MessageCount: 3}}, ack(1, true)}},
		{"consuming with acks keeps it", steps([]ackStep{{m: &wire.BasicConsume{Queue: "q"}}, {m: &wire.BasicGet{Queue: "q"}}}, deliverAll(1), []ackStep{ack(1, true)})},
		{"consuming without acks stops it", steps([]ackStep{{m: &wire.BasicConsume{Queue: "q", NoAck: true}}}, deliverAll(2), []ackStep{ack(1, false), ack(2, false)})},
		{"getting without acks stops it", steps([]ackStep{{m: &wire.BasicGet{Queue: "q", NoAck: true}}}, deliverAll(2), []ackStep{ack(1, false)})},
		{"recover stops it", steps(deliverAll(2), []ackStep{{m: &wire.BasicRecover{Requeue: true}}, ack(1, false)})},
		{"recover-async stops it", steps(deliverAll(2), []ackStep{{m: &wire.BasicRecoverAsync{}}, ack(1, false)})},
		{"settled as far ahead as it tracks", steps(deliverAll(ackAhead+2), []ackStep{ack(ackAhead, false), ackUpTo(ackAhead - 1), ack(ackAhead+1, true)})},
		{"settled further ahead than it tracks stops it", steps(deliverAll(ackAhead+2), []ackStep{ack(ackAhead+1, false), ack(1, false)})},
		{"multiple far ahead clears what was settled ahead", steps(deliverAll(3*ackAhead), []ackStep{ack(5, false), ackUpTo(2 * ackAhead), ack(2*ackAhead+1, true)})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			new(ackFloor).run(t, tt.steps)
		})
	}
	t.Run("a malformed ack", func(t *testing.T) {
		a := new(ackFloor)
		a.run(t, deliverAll(1))
		if a.settle(wire.IDBasicAck, wire.AppendMethod(nil, &wire.BasicAck{DeliveryTag: 1})[:12]) {
			t.Fatal("a 12-byte basic.ack was foldable")
		}
	})
	t.Run("stopped", func(t *testing.T) {
		a := new(ackFloor)
		a.run(t, deliverAll(1))
		a.stop() // what tx.select does
		a.run(t, []ackStep{ack(1, false)})
	})
}

// FuzzAckFloor plays a channel's deliveries and settlements against a
// model of RabbitMQ's unacked deliveries, with deliveries RabbitMQ made
// that the proxy has not relayed yet. An ack may only be foldable if it
// settles the lowest delivery RabbitMQ holds unsettled: then, folded into
// the next foldable ack as multiple, it settles the same deliveries.
// A settlement RabbitMQ refuses (406) ends the channel, and the input.
func FuzzAckFloor(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 0, 2, 1, 2, 2})
	f.Add([]byte{0, 3, 1, 0, 2, 2, 2, 1, 2, 3})
	f.Add([]byte{0, 4, 1, 0, 3, 2, 2, 3, 2, 4, 6, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var a ackFloor
		var made, relayed uint64     // RabbitMQ's deliveries, and those relayed
		settled := map[uint64]bool{} // RabbitMQ's settled tags
		lowest := func() uint64 {    // RabbitMQ's lowest unsettled tag; made+1 if none
			for tag := uint64(1); ; tag++ {
				if tag > made || !settled[tag] {
					return tag
				}
			}
		}
		for len(ops) >= 2 {
			op, arg := ops[0]%8, uint64(ops[1])
			ops = ops[2:]
			switch op {
			case 0: // RabbitMQ delivers arg%8+1 more
				made += arg%8 + 1
				continue
			case 1: // the proxy relays them
				for relayed < made {
					relayed++
					a.delivery(wire.IDBasicDeliver, wire.AppendMethod(nil, &wire.BasicDeliver{ConsumerTag: "c", DeliveryTag: relayed}))
				}
				continue
			}
			tag := arg % (made + 3)
			var m wire.Method
			multiple := op == 3 || op == 5
			switch op {
			case 2, 3:
				m = &wire.BasicAck{DeliveryTag: tag, Multiple: multiple}
			case 4, 5:
				m = &wire.BasicNack{DeliveryTag: tag, Multiple: multiple}
			default:
				m = &wire.BasicReject{DeliveryTag: tag}
			}
			fold := a.settle(m.ID(), wire.AppendMethod(nil, m))
			if fold && (tag != lowest() || tag > made) {
				t.Fatalf("%s %d foldable; RabbitMQ's lowest unsettled is %d of %d", m.ID(), tag, lowest(), made)
			}
			// RabbitMQ: a tag it holds unsettled, or, with multiple, 0.
			switch {
			case multiple && tag == 0:
				for x := uint64(1); x <= made; x++ {
					settled[x] = true
				}
			case tag == 0 || tag > made || settled[tag]:
				return // 406 unknown delivery tag: the channel is closed
			case multiple:
				for x := uint64(1); x <= tag; x++ {
					settled[x] = true
				}
			default:
				settled[tag] = true
			}
		}
	})
}

// TestWriterFoldsAcks: foldable acks written side by side on one channel
// leave as the last of them with multiple set; anything between them, a
// channel apart, or an ack that is not foldable, leaves them as they are.
func TestWriterFoldsAcks(t *testing.T) {
	one, two := &Channel{id: 1}, &Channel{id: 2}
	ackItem := func(ch *Channel, tag uint64, foldable bool) outItem {
		it := relayItem(ch, wire.FrameMethod, wire.AppendMethod(nil, &wire.BasicAck{DeliveryTag: tag}))
		it.foldable = foldable
		return it
	}
	tests := []struct {
		name  string
		items []outItem
		want  []string
	}{
		{"a run", []outItem{ackItem(one, 1, true), ackItem(one, 2, true), ackItem(one, 3, true)},
			[]string{"1/1/ack 3 true"}},
		{"one alone", []outItem{ackItem(one, 4, true)}, []string{"1/1/ack 4 false"}},
		{"not foldable behind", []outItem{ackItem(one, 1, true), ackItem(one, 5, false), ackItem(one, 2, true)},
			[]string{"1/1/ack 1 false", "1/1/ack 5 false", "1/1/ack 2 false"}},
		{"a frame between", []outItem{ackItem(one, 1, true),
			relayItem(one, wire.FrameMethod, wire.AppendMethod(nil, &wire.BasicQos{PrefetchCount: 1})), ackItem(one, 2, true)},
			[]string{"1/1/ack 1 false", "1/1/basic.qos", "1/1/ack 2 false"}},
		{"channels apart", []outItem{ackItem(one, 1, true), ackItem(two, 1, true), ackItem(two, 2, true), ackItem(one, 2, true)},
			[]string{"1/1/ack 1 false", "1/2/ack 2 true", "1/1/ack 2 false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pw := startPipeWriter(t, 0)
			for _, it := range tt.items {
				pw.w.q.pushQuiet(it) // one batch: the writer is woken once
			}
			pw.w.q.wake()
			pw.expect(t, tt.want...)
			select {
			case got := <-pw.out:
				t.Fatalf("wrote %q as well", got)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

// foldCount counts AcksFolded.
type foldCount struct {
	noMetrics
	n atomic.Int64
}

func (f *foldCount) AcksFolded(n int) { f.n.Add(int64(n)) }

// TestAckFoldWithRabbitMQ runs a consumer's settlements, sent in one
// write, straight to RabbitMQ and through the proxy: the deliveries left
// unsettled (requeued when the connection closes), and the channel error
// where RabbitMQ refuses one, are the same both ways; through the proxy,
// the acks that could be folded were.
func TestAckFoldWithRabbitMQ(t *testing.T) {
	t.Parallel()
	const n = 5 // deliveries, tags 1 to 5
	acks := func(tags ...uint64) []wire.Method {
		var ms []wire.Method
		for _, tag := range tags {
			ms = append(ms, &wire.BasicAck{DeliveryTag: tag})
		}
		return ms
	}
	tests := []struct {
		name    string
		noAck   bool // consume without acks
		tx      bool // settle in a transaction, then roll it back
		settle  []wire.Method
		left    int    // deliveries back in the queue at the end
		errText string // the channel.close RabbitMQ sends (406), if any
		folded  int64  // acks folded by the proxy
	}{
		{name: "in order", settle: acks(1, 2, 3, 4, 5), left: 0, folded: 4},
		{name: "all but the first", settle: acks(2, 3, 4, 5), left: 1},
		{name: "all but the last", settle: acks(1, 2, 3, 4), left: 1, folded: 3},
		{name: "one in the middle left", settle: acks(1, 2, 4, 5), left: 1, folded: 1},
		{name: "a nack first", settle: append([]wire.Method{&wire.BasicNack{DeliveryTag: 1}}, acks(2, 3, 4, 5)...), left: 0, folded: 3},
		{name: "multiple, then singles", settle: append([]wire.Method{&wire.BasicAck{DeliveryTag: 2, Multiple: true}}, acks(3, 4, 5)...), left: 0, folded: 2},
		{name: "an ack twice", settle: acks(1, 2, 2, 3), left: 3, errText: "PRECONDITION_FAILED - unknown delivery tag 2", folded: 1},
		{name: "an ack of a tag not delivered", settle: acks(1, 7), left: 4, errText: "PRECONDITION_FAILED - unknown delivery tag 7"},
		{name: "an ack without acks", noAck: true, settle: acks(1, 2), left: 0, errText: "PRECONDITION_FAILED - unknown delivery tag 1"},
		{name: "acks rolled back", tx: true, settle: acks(1, 2, 3, 4, 5), left: n},
	}
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				folds := &foldCount{}
				p := startProxyOn(t, b, Config{Metrics: folds})
				for _, via := range []struct{ name, addr string }{{"direct", b.Addr(t)}, {"proxy", p.addr}} {
					q := b.DeclareQueue(t, false, nil)
					testbroker.WithChannel(t, b.URL, func(ch *amqp.Channel) error {
						for i := range n {
							if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte{byte('a' + i)}}); err != nil {
								return err
							}
						}
						return nil
					})
					testwait.Until(t, 10*time.Second, fmt.Sprintf("%d messages in %s", n, q), func() bool { return b.QueueDepth(t, q) == n })
					if got := consumeAndSettle(t, via.addr, q, n, tt.noAck, tt.tx, tt.settle); got != tt.errText {
						t.Errorf("%s: channel closed with %q, want %q", via.name, got, tt.errText)
					}
					testwait.Until(t, 10*time.Second, fmt.Sprintf("%s: %d messages left in %s", via.name, tt.left, q),
						func() bool { return b.QueueDepth(t, q) == tt.left })
				}
				// The writer counts its folds after the write that
				// RabbitMQ may have answered already.
				testwait.Until(t, 5*time.Second, fmt.Sprintf("%d acks folded (folded: %d)", tt.folded, folds.n.Load()),
					func() bool { return folds.n.Load() == tt.folded })
			})
		}
	})
}

// consumeAndSettle consumes n deliveries from q on a raw connection to
// addr, sends the settlements in one write (in a transaction rolled back
// after, with tx), and returns the text of the channel.close RabbitMQ sent
// for them ("" when a basic.qos after them was answered). It closes the
// connection, so that what is unsettled goes back to the queue.
func consumeAndSettle(t *testing.T, addr, q string, n int, noAck, tx bool, settle []wire.Method) string {
	t.Helper()
	c := rawDial(t, addr)
	c.open(rawLogin{})
	c.send(1, &wire.ChannelOpen{})
	c.expect(1, wire.IDChannelOpenOk)
	if tx {
		c.send(1, &wire.TxSelect{})
		c.expect(1, wire.IDTxSelectOk)
	}
	c.send(1, &wire.BasicConsume{Queue: q, NoAck: noAck})
	c.expect(1, wire.IDBasicConsumeOk)
	for tag := uint64(1); tag <= uint64(n); {
		f, m, err := c.next()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := m.(*wire.BasicDeliver); ok && f.Channel == 1 {
			if d.DeliveryTag != tag {
				t.Fatalf("delivery tag %d, want %d", d.DeliveryTag, tag)
			}
			for range 2 { // its header and its one-byte body
				if _, _, err := c.next(); err != nil {
					t.Fatal(err)
				}
			}
			tag++
		}
	}
	var burst []byte
	for _, m := range settle {
		burst = wire.AppendFrame(burst, wire.Frame{Type: wire.FrameMethod, Channel: 1, Payload: wire.AppendMethod(nil, m)})
	}
	if tx {
		burst = wire.AppendFrame(burst, wire.Frame{Type: wire.FrameMethod, Channel: 1, Payload: wire.AppendMethod(nil, &wire.TxRollback{})})
	}
	c.raw(burst)
	if tx {
		c.expect(1, wire.IDTxRollbackOk)
	}
	c.send(1, &wire.BasicQos{PrefetchCount: 1})
	var errText string
	for {
		f, m, err := c.next()
		if err != nil {
			t.Fatal(err)
		}
		if f.Channel != 1 || m == nil {
			continue
		}
		if m.ID() == wire.IDBasicQosOk {
			break
		}
		if cm, ok := m.(*wire.ChannelClose); ok {
			if cm.ReplyCode != wire.PreconditionFailed {
				t.Fatalf("channel.close %d %q, want 406", cm.ReplyCode, cm.ReplyText)
			}
			errText = cm.ReplyText
			c.send(1, &wire.ChannelCloseOk{})
			break
		}
	}
	c.send(0, &wire.ConnectionClose{ReplyCode: wire.ReplySuccess})
	c.expect(0, wire.IDConnectionCloseOk)
	return errText
}

// TestAckFoldConcurrentAcks consumes through the proxy with four
// goroutines settling deliveries in whatever order they get them, one in
// twenty a nack that requeues (redelivered under a new tag): every message
// is acked once, the channel stays open, and nothing is left unsettled,
// which a fold that settled a delivery the client had not would break (a
// message never redelivered, or one settled twice: 406).
func TestAckFoldConcurrentAcks(t *testing.T) {
	t.Parallel()
	const n = 3000
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		folds := &foldCount{}
		p := startProxyOn(t, b, Config{Metrics: folds})
		q := b.DeclareQueue(t, false, nil)
		testbroker.WithChannel(t, b.URL, func(ch *amqp.Channel) error {
			for i := range n {
				if err := ch.Publish("", q, false, false, amqp.Publishing{MessageId: fmt.Sprint(i)}); err != nil {
					return err
				}
			}
			return nil
		})
		ch := testbroker.Channel(t, p.dial(t, amqp.Config{}))
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		if err := ch.Qos(200, 0, false); err != nil {
			t.Fatal(err)
		}
		msgs, err := ch.Consume(q, "fold", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		acked := make(chan string, n)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for k := 0; ; k++ {
					d, ok := <-msgs
					if !ok {
						return
					}
					if (k+w)%20 == 0 {
						if err := d.Nack(false, true); err != nil {
							return
						}
						continue
					}
					if d.Ack(false) != nil {
						return
					}
					acked <- d.MessageId
				}
			})
		}
		seen := map[string]bool{}
		timeout := time.After(30 * time.Second)
		for len(seen) < n {
			select {
			case id := <-acked:
				if seen[id] {
					t.Fatalf("message %s acked twice", id)
				}
				seen[id] = true
			case e := <-closed:
				t.Fatalf("channel closed after %d acks: %v", len(seen), e)
			case <-timeout:
				t.Fatalf("%d of %d messages acked", len(seen), n)
			}
		}
		if err := ch.Cancel("fold", false); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := ch.Close(); err != nil {
			t.Fatalf("channel.close: %v", err)
		}
		if left := b.QueueDepth(t, q); left != 0 {
			t.Fatalf("%d messages back in the queue after every one was acked", left)
		}
		t.Logf("%d acks folded", folds.n.Load())
	})
}
