package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestExchangeDelete_DiscardsOnlyPending: an exchange deleted while its
// messages are being released, right after the first ones arrive or later,
// counts as discarded only the messages that were still pending: every
// stored message is either released (confirmed by RabbitMQ: in the queue,
// or returned unroutable) or discarded, never both, never neither. Releases that RabbitMQ
// confirmed but whose store delete was still lingering, and releases in
// flight at the delete that it confirms, are not discarded. The real
// exchange stays deleted.
func TestExchangeDelete_DiscardsOnlyPending(t *testing.T) {
	t.Parallel()
	const (
		rounds = 12
		n      = 150
		delay  = 300 // ms for the first message; then 2 ms apart
	)
	tp := startProxy(t, nil)
	conn := tp.dial(t)
	ch := confirmChannel(t, conn)
	broker := testbroker.Dial(t, testbroker.URL(t))

	for round := range rounds {
		ex, q, cons := delayedFanoutOn(t, testbroker.Default(t), ch)
		released0 := tp.metric(t, "delayproxy_messages_released_total")
		discarded0 := tp.metric(t, "delayproxy_messages_discarded_total")
		unroutable0 := tp.metric(t, "delayproxy_messages_unroutable_total")

		dcs := make([]*amqp.DeferredConfirmation, n)
		for i := range n {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "", false, false,
				delayedMsg(int32(delay+2*i), fmt.Sprintf("r%d-%d", round, i)))
			if err != nil {
				t.Fatalf("round %d: publish: %v", round, err)
			}
			dcs[i] = dc
		}
		for i, dc := range dcs {
			if !dc.Wait() {
				t.Fatalf("round %d: publish %d nacked", round, i)
			}
		}
		// Delete after the first arrival in the first rounds, later in
		// the others (up to about two thirds released).
		after := 1 + round*round*100/(rounds*rounds)
		cons.wait(t, after, 20*time.Second)
		began := time.Now()
		if err := ch.ExchangeDelete(ex, false, false); err != nil {
			t.Fatalf("round %d: delete: %v", round, err)
		}
		took := time.Since(began)

		// What RabbitMQ confirmed arrives in the queue, and the discarded
		// are counted once the releases in flight at the delete are
		// answered (at most the releaser's confirm timeout): wait for the
		// counts to add up, then check that they stay so.
		// A release RabbitMQ confirmed reached the queue, or was returned
		// unroutable: routed as the bindings went with the exchange.
		counts := func() (released, routed, arrived, discarded int) {
			released = int(tp.metric(t, "delayproxy_messages_released_total") - released0)
			routed = released - int(tp.metric(t, "delayproxy_messages_unroutable_total")-unroutable0)
			return released, routed, len(cons.snapshot()), int(tp.metric(t, "delayproxy_messages_discarded_total") - discarded0)
		}
		deadline := time.Now().Add(45 * time.Second)
		for {
			released, routed, arrived, discarded := counts()
			if routed <= arrived && released+discarded == n || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		settled := time.Since(began)
		time.Sleep(100 * time.Millisecond)
		released, routed, arrived, discarded := counts()
		t.Logf("round %d: deleted after %d arrivals, in %v, counted in %v: stored %d, released %d (unroutable %d), arrived %d, discarded %d",
			round, after, took.Round(time.Millisecond), settled.Round(time.Millisecond), n, released, released-routed, arrived, discarded)
		switch {
		case arrived < routed:
			t.Errorf("round %d: %d releases confirmed and not returned, the queue got only %d", round, routed, arrived)
		case arrived > routed:
			// The 404 that closed the release channel can cost the
			// confirms of releases RabbitMQ routed just before it:
			// unconfirmed, they are stale at their retry and discarded.
			t.Logf("round %d: RabbitMQ delivered %d releases whose confirm the releaser did not get", round, arrived-routed)
		}
		if released+discarded != n {
			t.Errorf("round %d: stored %d = released %d + discarded %d does not hold", round, n, released, discarded)
		}
		if depth := queueDepth(t, q); depth != 0 {
			t.Errorf("round %d: %d messages in the queue the consumer did not get", round, depth)
		}
		bch, err := broker.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := bch.ExchangeDeclarePassive(ex, "fanout", true, false, false, false, nil); !errorIs(err, amqp.NotFound, "") {
			t.Errorf("round %d: the deleted exchange exists upstream again: passive declare = %v", round, err)
			bch, _ = broker.Channel()
		}
		bch.Close()
	}
}
