package amqpproxy

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// testHooks is a configurable interceptor: every field may be nil.
type testHooks struct {
	methods    []wire.MethodID
	method     func(*Call)
	intercepts func(*Channel, *wire.BasicPublish) bool
	content    func(*Channel, *wire.BasicPublish, []byte) bool
	publish    func(*Publish)

	opened, closed atomic.Int32
	wg             sync.WaitGroup // goroutines the test's hooks start
}

func (h *testHooks) Open(*Conn) ConnHooks {
	h.opened.Add(1)
	return h
}

func (h *testHooks) Methods() []wire.MethodID { return h.methods }

func (h *testHooks) Method(c *Call) {
	if h.method != nil {
		h.method(c)
	}
}

// InterceptsPublish claims a publish with its exchange's name.
func (h *testHooks) InterceptsPublish(ch *Channel, m *wire.BasicPublish) (any, bool) {
	return m.Exchange, h.intercepts != nil && h.intercepts(ch, m)
}

// InterceptsContent claims a publish with its exchange's name.
func (h *testHooks) InterceptsContent(ch *Channel, m *wire.BasicPublish, props []byte) (any, bool) {
	return m.Exchange, h.content != nil && h.content(ch, m, props)
}

func (h *testHooks) Publish(p *Publish) {
	if h.publish != nil {
		h.publish(p)
		return
	}
	p.Relay()
}

func (h *testHooks) Closed(error) { h.closed.Add(1) }

// later runs f after d in a goroutine the test waits for.
func (h *testHooks) later(d time.Duration, f func()) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		time.Sleep(d)
		f()
	}()
}

// takeEveryThird is an interceptor that takes over every third publish of
// each channel and answers it after a random delay, with ack (3 in 4) or
// nack; the others are relayed. fate records the answer by body.
type takeEveryThird struct {
	testHooks
	mu    sync.Mutex // guards fate, count, rng
	fate  map[string]bool
	count map[*Channel]int
	rng   *rand.Rand
	hold  time.Duration // longest answer delay
	taken atomic.Int64
}

func newTakeEveryThird(seed uint64, hold time.Duration) *takeEveryThird {
	h := &takeEveryThird{fate: map[string]bool{}, count: map[*Channel]int{}, rng: rand.New(rand.NewPCG(seed, 3)), hold: hold}
	h.intercepts = func(*Channel, *wire.BasicPublish) bool { return true }
	h.publish = func(p *Publish) {
		h.mu.Lock()
		h.count[p.Channel]++
		take := h.count[p.Channel]%3 == 0
		ack := h.rng.IntN(4) != 0
		delay := time.Duration(h.rng.Int64N(int64(h.hold) + 1))
		if take {
			h.fate[string(p.Body)] = ack
		}
		h.mu.Unlock()
		if !take {
			p.Relay()
			return
		}
		h.taken.Add(1)
		h.later(delay, func() {
			if ack {
				p.Ack()
			} else {
				p.Nack()
			}
		})
	}
	return h
}

func (h *takeEveryThird) answer(body string) (ack, taken bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ack, taken = h.fate[body]
	return ack, taken
}

// publishAndCheck puts ch in confirm mode, publishes n messages without
// waiting, then checks that every tag is confirmed once with the fate
// expected for its message. It returns how many were relayed (not taken
// over by takeEveryThird).
func publishAndCheck(t *testing.T, ch *amqp.Channel, prefix, key string, n int, fate func(body string) (bool, bool)) (relayed int) {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	checkConfirms(t, ch, confirms, 1, prefix, key, n, fate)
	return n - n/3
}

// withHeaders, passed to checkConfirms, gives every other message a
// headers table.
var withHeaders = func(i int) amqp.Table {
	if i%2 == 0 {
		return amqp.Table{"i": int64(i)}
	}
	return nil
}

// checkConfirms publishes n messages on a channel in confirm mode whose
// next tag is first, and checks their confirms.
// With headers set, message i carries headers(i).
func checkConfirms(t *testing.T, ch *amqp.Channel, confirms <-chan amqp.Confirmation, first uint64, prefix, key string, n int, fate func(body string) (bool, bool), headers ...func(int) amqp.Table) {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	for i := 1; i <= n; i++ {
		msg := amqp.Publishing{Body: fmt.Appendf(nil, "%s-%d", prefix, i)}
		if len(headers) > 0 {
			msg.Headers = headers[0](i)
		}
		if err := ch.PublishWithContext(ctx, "", key, false, false, msg); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= n; i++ {
		var c amqp.Confirmation
		select {
		case c = <-confirms:
		case <-ctx.Done():
			t.Fatalf("%s: %d of %d confirms", prefix, i-1, n)
		}
		if c.DeliveryTag != first+uint64(i-1) {
			t.Fatalf("%s: confirm %d has tag %d", prefix, i, c.DeliveryTag)
		}
		body := fmt.Sprintf("%s-%d", prefix, i)
		var want, known bool
		testwait.Until(t, 5*time.Second, "the fate of "+body, func() bool { want, known = fate(body); return known })
		if c.Ack != want {
			t.Fatalf("%s: tag %d ack=%v, want %v", prefix, c.DeliveryTag, c.Ack, want)
		}
	}
}

// TestInterceptConfirmsFakeBroker: every third publish taken over and
// answered later, the rest confirmed by a peer that acks out of order,
// with multiple acks over gaps, and nacks; four channels at once. Each
// client tag must get exactly its own fate.
func TestInterceptConfirmsFakeBroker(t *testing.T) {
	t.Parallel()
	fb := startFakeBroker(t)
	hooks := newTakeEveryThird(1, 20*time.Millisecond)
	p := startProxy(t, Config{Upstream: fb.url(), Interceptor: hooks})
	conn := p.dial(t, amqp.Config{})
	fate := func(body string) (bool, bool) {
		if ack, ok := hooks.answer(body); ok {
			return ack, true
		}
		return fb.fate(body)
	}
	var wg sync.WaitGroup
	for c := range 4 {
		ch := testbroker.Channel(t, conn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishAndCheck(t, ch, fmt.Sprintf("ch%d", c), "q", 600, fate)
		}()
	}
	wg.Wait()
	hooks.wg.Wait()
	if hooks.taken.Load() != 4*200 {
		t.Fatalf("%d publishes taken over", hooks.taken.Load())
	}
}

// TestInterceptConfirmsRabbitMQ: the same through RabbitMQ, which acks in
// its own way (often multiple); the relayed messages are in the queue.
func TestInterceptConfirmsRabbitMQ(t *testing.T) {
	t.Parallel()
	hooks := newTakeEveryThird(2, 20*time.Millisecond)
	p := startProxy(t, Config{Interceptor: hooks})
	q := testbroker.DeclareQueue(t, false, nil)
	conn := p.dial(t, amqp.Config{})
	fate := func(body string) (bool, bool) {
		if ack, ok := hooks.answer(body); ok {
			return ack, true
		}
		return true, true // RabbitMQ acks what it routes
	}
	var wg sync.WaitGroup
	relayed := make([]int, 3)
	for c := range 3 {
		ch := testbroker.Channel(t, conn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			relayed[c] = publishAndCheck(t, ch, fmt.Sprintf("ch%d", c), q, 900, fate)
		}()
	}
	wg.Wait()
	hooks.wg.Wait()
	st, err := testbroker.Channel(t, conn).QueueDeclarePassive(q, false, false, false, false, nil)
	if want := relayed[0] + relayed[1] + relayed[2]; err != nil || st.Messages != want {
		t.Fatalf("queue holds %d (%v), want the %d relayed", st.Messages, err, want)
	}
}

// TestInterceptContent: publishes not taken at basic.publish are offered
// to InterceptsContent when, and only when, their properties carry
// headers; every third of those is taken over and answered later, the
// rest relayed, as are the publishes without headers (their method frames
// held until the header is in). Each client tag must get its own fate, and
// RabbitMQ must see whole messages (it closes the connection otherwise).
func TestInterceptContent(t *testing.T) {
	t.Parallel()
	for _, upstream := range []string{"fake", "rabbitmq"} {
		t.Run(upstream, func(t *testing.T) {
			t.Parallel()
			hooks := newTakeEveryThird(4, 20*time.Millisecond)
			hooks.intercepts = nil
			var offered, without atomic.Int64
			hooks.content = func(_ *Channel, _ *wire.BasicPublish, props []byte) bool {
				offered.Add(1)
				if p, err := wire.DecodeProperties(props); err != nil || p.Headers == nil {
					without.Add(1)
				}
				return true
			}
			cfg := Config{Interceptor: hooks}
			upFate := func(string) (bool, bool) { return true, true }
			q := "q"
			if upstream == "fake" {
				fb := startFakeBroker(t)
				cfg.Upstream, upFate = fb.url(), fb.fate
			} else {
				q = testbroker.DeclareQueue(t, false, nil)
			}
			fate := func(body string) (bool, bool) {
				if ack, ok := hooks.answer(body); ok {
					return ack, true
				}
				return upFate(body)
			}
			p := startProxy(t, cfg)
			conn := p.dial(t, amqp.Config{})
			var wg sync.WaitGroup
			for c := range 3 {
				ch := testbroker.Channel(t, conn)
				if err := ch.Confirm(false); err != nil {
					t.Fatal(err)
				}
				confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 600))
				wg.Add(1)
				go func() {
					defer wg.Done()
					checkConfirms(t, ch, confirms, 1, fmt.Sprintf("ch%d", c), q, 600, fate, withHeaders)
				}()
			}
			wg.Wait()
			hooks.wg.Wait()
			if offered.Load() != 3*300 || without.Load() != 0 || hooks.taken.Load() != 3*100 {
				t.Fatalf("offered %d publishes (%d without headers), took %d; want 900, 0, 300", offered.Load(), without.Load(), hooks.taken.Load())
			}
			if upstream == "rabbitmq" {
				st, err := testbroker.Channel(t, conn).QueueDeclarePassive(q, false, false, false, false, nil)
				if err != nil || st.Messages != 3*500 {
					t.Fatalf("queue holds %d (%v), want the 1500 relayed", st.Messages, err)
				}
			}
		})
	}
}

// TestInterceptChannelClosedWithConfirmsPending: answers for a channel the
// client closed are never sent (amqp091-go would close the connection on
// a basic.ack for a closed channel); the connection and a new channel with
// the same number go on.
func TestInterceptChannelClosedWithConfirmsPending(t *testing.T) {
	t.Parallel()
	for _, upstream := range []string{"fake", "rabbitmq"} {
		t.Run(upstream, func(t *testing.T) {
			t.Parallel()
			hooks := newTakeEveryThird(3, 150*time.Millisecond)
			cfg := Config{Interceptor: hooks}
			fate := func(body string) (bool, bool) {
				if ack, ok := hooks.answer(body); ok {
					return ack, true
				}
				return true, true
			}
			q := "q"
			if upstream == "fake" {
				fb := startFakeBroker(t)
				cfg.Upstream = fb.url()
				fate = func(body string) (bool, bool) {
					if ack, ok := hooks.answer(body); ok {
						return ack, true
					}
					return fb.fate(body)
				}
			} else {
				q = testbroker.DeclareQueue(t, false, nil)
			}
			p := startProxy(t, cfg)
			conn := p.dial(t, amqp.Config{})
			closed := conn.NotifyClose(make(chan *amqp.Error, 1))
			for round := range 3 {
				ch := testbroker.Channel(t, conn)
				if err := ch.Confirm(false); err != nil {
					t.Fatal(err)
				}
				for i := range 30 {
					publish(t, ch, "", q, amqp.Publishing{Body: fmt.Appendf(nil, "closing-%d-%d", round, i)})
				}
				if err := ch.Close(); err != nil { // taken-over answers still pending
					t.Fatal(err)
				}
			}
			hooks.wg.Wait() // every late answer has been given
			ch := testbroker.Channel(t, conn)
			publishAndCheck(t, ch, "after", q, 30, fate)
			select {
			case e := <-closed:
				t.Fatalf("connection closed: %v", e)
			default:
			}
		})
	}
}

// TestInterceptHookSeesWhatWasRelayedBefore: frames relayed from the same
// socket read as a publish are written upstream before a hook is called
// for it, so a hook may wait on them: here a queue.declare and a publish
// come in one write, and the Publish hook waits for RabbitMQ to have the
// queue.
func TestInterceptHookSeesWhatWasRelayedBefore(t *testing.T) {
	t.Parallel()
	direct := testbroker.Dial(t, testbroker.URL(t))
	q := testbroker.UniqueName(t, "declared-before")
	t.Cleanup(func() { testbroker.Channel(t, direct).QueueDelete(q, false, false, false) })
	// exists polls for the queue from the hook's goroutine, for up to 5 s.
	exists := func() bool {
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			ch, err := direct.Channel()
			if err != nil {
				return false
			}
			_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil) // a 404 closes ch
			if err == nil {
				ch.Close()
				return true
			}
		}
		return false
	}
	saw := make(chan bool, 1)
	hooks := &testHooks{
		intercepts: func(*Channel, *wire.BasicPublish) bool { return true },
		publish: func(p *Publish) {
			saw <- exists()
			p.Relay()
		},
	}
	p := startProxy(t, Config{Interceptor: hooks})
	c := rawDial(t, p.addr)
	c.open(rawLogin{})
	c.send(1, &wire.ChannelOpen{})
	c.expect(1, wire.IDChannelOpenOk)
	var one []byte
	for _, f := range []wire.Frame{
		{Type: wire.FrameMethod, Channel: 1, Payload: wire.AppendMethod(nil, &wire.QueueDeclare{Queue: q, NoWait: true})},
		{Type: wire.FrameMethod, Channel: 1, Payload: wire.AppendMethod(nil, &wire.BasicPublish{RoutingKey: q})},
		{Type: wire.FrameHeader, Channel: 1, Payload: wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 60, BodySize: 2})},
		{Type: wire.FrameBody, Channel: 1, Payload: []byte("hi")},
	} {
		one = wire.AppendFrame(one, f)
	}
	c.raw(one)
	if !<-saw {
		t.Fatal("the hook never saw the queue declared in the same write")
	}
}
