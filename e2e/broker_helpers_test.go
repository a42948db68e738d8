package e2e

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// Helpers that go straight to RabbitMQ, not through a proxy: the default
// broker's (3.10) and, in their On variants, the broker a test names.
// Queues (testbroker.DeclareQueue) and exchanges are durable here, so that
// they survive broker faults.

// declarePlainExchangeOn declares a non-delayed exchange on broker b and
// deletes it in t.Cleanup.
func declarePlainExchangeOn(t testing.TB, b testbroker.Broker, typ string) string {
	t.Helper()
	name := testbroker.UniqueName(t, "px")
	ch := testbroker.Channel(t, testbroker.Dial(t, b.URL))
	if err := ch.ExchangeDeclare(name, typ, true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange: %v", err)
	}
	ch.Close()
	t.Cleanup(func() { b.DeleteExchange(t, name) })
	return name
}

// bind binds queue to exchange on the broker.
func bind(t testing.TB, queue, key, exchange string, args amqp.Table) {
	t.Helper()
	bindOn(t, testbroker.Default(t), queue, key, exchange, args)
}

// bindOn is bind on broker b.
func bindOn(t testing.TB, b testbroker.Broker, queue, key, exchange string, args amqp.Table) {
	t.Helper()
	ch := testbroker.Channel(t, testbroker.Dial(t, b.URL))
	defer ch.Close()
	if err := ch.QueueBind(queue, key, exchange, false, args); err != nil {
		t.Fatalf("bind %s to %s (%q): %v", queue, exchange, key, err)
	}
}

// drain gets every message from queue on the broker with basic.get, until
// it is empty.
func drain(t testing.TB, queue string) []amqp.Delivery {
	t.Helper()
	return drainOn(t, testbroker.Default(t), queue)
}

// drainOn is drain on broker b.
func drainOn(t testing.TB, b testbroker.Broker, queue string) []amqp.Delivery {
	t.Helper()
	ch := testbroker.Channel(t, testbroker.Dial(t, b.URL))
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// queueDepth is the number of ready messages in queue.
func queueDepth(t testing.TB, queue string) int {
	t.Helper()
	return testbroker.Default(t).QueueDepth(t, queue)
}
