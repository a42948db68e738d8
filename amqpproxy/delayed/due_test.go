package delayed_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/store"
)

// TestXDelayCountsFromThePublish: a publish sent right behind a no-wait
// declare of its delayed exchange waits for the declare's registry write
// (held here for 300 ms) before it is stored; its x-delay still counts
// from when the proxy took it, not from after that wait. The same holds
// for the wait for RabbitMQ's permission check, a dial of the probe
// connection on a connection's first delayed publish (5-6 ms here).
func TestXDelayCountsFromThePublish(t *testing.T) {
	t.Parallel()
	const hold, delay = 300 * time.Millisecond, 1000
	ch, dues := heldDeclareRelay(t, hold)
	ex := testbroker.UniqueName(t, "dp-due")
	sent := time.Now()
	if err := ch.ExchangeDeclare(ex, "x-delayed-message", false, false, false, true, amqp.Table{"x-delayed-type": "direct"}); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, amqp.Publishing{Headers: amqp.Table{"x-delay": int64(delay)}})
	if err != nil {
		t.Fatal(err)
	}
	if !dc.Wait() {
		t.Fatal("the delayed publish was nacked")
	}
	if waited := time.Since(sent); waited < hold {
		t.Fatalf("confirmed after %v: the declare's registry write was not waited for", waited)
	}
	if late := time.UnixMilli(<-dues - delay).Sub(sent); late >= hold/2 {
		t.Fatalf("due %v after the publish was sent plus its x-delay: counted from after the wait for the declare", late)
	}
	if err := ch.ExchangeDelete(ex, false, false); err != nil {
		t.Error(err)
	}
}

// heldDeclareRelay starts a relay whose store holds each exchange's
// registry write for hold, so that a publish right behind a no-wait
// declare waits that long in the client reader, and returns a confirm
// channel through it and the due times of the messages it stores, in
// order.
func heldDeclareRelay(t *testing.T, hold time.Duration) (*amqp.Channel, <-chan int64) {
	t.Helper()
	dues := make(chan int64, 16)
	w := &storeWrapper{
		wait: func(msgs []*store.Message, answer func() error) error {
			for _, m := range msgs {
				dues <- m.Due
			}
			return answer()
		},
		beforePutExchange: func() { time.Sleep(hold) },
	}
	r := startWireRelay(t, testbroker.Default(t), delayed.Config{Store: w}, amqpproxy.Config{})
	ch, err := r.confirmChannel(t)
	if err != nil {
		t.Fatal(err)
	}
	return ch, dues
}
