package delayed_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestXDelayCountsFromTheArrival: a publish that waits in the client
// socket while the proxy's reader is held up (here by the publish before
// it, which waits 300 ms for its exchange's registry write) counts its
// x-delay from when its bytes reached the proxy's host (the kernel's
// receive time), not from when the reader took it up, and is never due
// before it was sent plus its delay.
func TestXDelayCountsFromTheArrival(t *testing.T) {
	t.Parallel()
	const hold, delay = 300 * time.Millisecond, 1000
	ch, dues := heldDeclareRelay(t, hold)
	ex := testbroker.UniqueName(t, "dp-arrival")
	if err := ch.ExchangeDeclare(ex, "x-delayed-message", false, false, false, true, amqp.Table{"x-delayed-type": "direct"}); err != nil {
		t.Fatal(err)
	}
	msg := amqp.Publishing{Headers: amqp.Table{"x-delay": int64(delay)}}
	first, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, msg)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	second, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, msg)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Wait() || !second.Wait() {
		t.Fatal("a delayed publish was nacked")
	}
	if waited := time.Since(sent); waited < hold/2 {
		t.Fatalf("confirmed after %v: the reader was not held up", waited)
	}
	<-dues
	counted := time.UnixMilli(<-dues - delay)
	if counted.Before(sent.Truncate(time.Millisecond)) {
		t.Fatalf("the second publish counts from %v, before it was sent (%v): early", counted, sent)
	}
	if late := counted.Sub(sent); late >= hold/2 {
		t.Fatalf("the second publish counts from %v after it was sent: from when the reader took it up", late)
	}
	if err := ch.ExchangeDelete(ex, false, false); err != nil {
		t.Error(err)
	}
}
