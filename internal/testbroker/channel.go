package testbroker

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// WithChannel runs f on a channel of a fresh connection to the AMQP URL u
// (a test broker, or a proxy in front of it) and closes the connection
// after. Any error fails the test (in a t.Cleanup function it ends that
// function only; the other cleanups still run).
func WithChannel(t testing.TB, u string, f func(*amqp.Channel) error) {
	t.Helper()
	c, err := amqp.Dial(u)
	if err != nil {
		t.Fatalf("testbroker: dial %s: %v", redacted(u), err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("testbroker: channel.open on %s: %v", redacted(u), err)
	}
	if err := f(ch); err != nil {
		t.Fatalf("testbroker: %v", err)
	}
}

// DeleteQueue deletes a queue on the default broker, for t.Cleanup.
func DeleteQueue(t testing.TB, name string) {
	t.Helper()
	Default(t).DeleteQueue(t, name)
}

// DeleteQueue deletes a queue on the broker, for t.Cleanup.
func (b Broker) DeleteQueue(t testing.TB, name string) {
	t.Helper()
	WithChannel(t, b.URL, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	})
}

// DeleteExchange deletes an exchange on the default broker, for t.Cleanup.
func DeleteExchange(t testing.TB, name string) {
	t.Helper()
	Default(t).DeleteExchange(t, name)
}

// DeleteExchange deletes an exchange on the broker, for t.Cleanup.
func (b Broker) DeleteExchange(t testing.TB, name string) {
	t.Helper()
	WithChannel(t, b.URL, func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
}

// DeclareQueue declares a queue on the default broker (Broker.DeclareQueue).
func DeclareQueue(t testing.TB, durable bool, args amqp.Table) string {
	t.Helper()
	return Default(t).DeclareQueue(t, durable, args)
}

// DeclareQueue declares a queue named UniqueName(t, "q") with args on the
// broker, durable or not, and deletes it in t.Cleanup.
func (b Broker) DeclareQueue(t testing.TB, durable bool, args amqp.Table) string {
	t.Helper()
	name := UniqueName(t, "q")
	WithChannel(t, b.URL, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(name, durable, false, false, false, args); err != nil {
			return fmt.Errorf("declare queue %v: %w", args, err)
		}
		return nil
	})
	t.Cleanup(func() { b.DeleteQueue(t, name) })
	return name
}

// QueueDepth is the number of messages ready in queue on the broker.
func (b Broker) QueueDepth(t testing.TB, queue string) int {
	t.Helper()
	var n int
	WithChannel(t, b.URL, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("passive declare %s: %w", queue, err)
		}
		n = q.Messages
		return nil
	})
	return n
}

// redacted is u without its password, for messages.
func redacted(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return pu.Redacted()
}

// Dial connects to the AMQP URL u (a test broker, or a proxy in front of
// it) as a connection named after the test, so that RabbitMQ's list of
// connections shows whose it is; it is closed in t.Cleanup.
func Dial(t testing.TB, u string) *amqp.Connection {
	t.Helper()
	c, err := amqp.DialConfig(u, amqp.Config{
		Properties: amqp.Table{"connection_name": "dp-test " + t.Name()},
	})
	if err != nil {
		t.Fatalf("testbroker: dial %s: %v", redacted(u), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Channel opens a channel on c.
func Channel(t testing.TB, c *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("testbroker: channel.open: %v", err)
	}
	return ch
}

// AwaitClose waits up to d for a channel or connection to close (closed is
// its NotifyClose channel) and returns the error RabbitMQ or the proxy
// closed it with; it fails the test if it is still open after d or closed
// without an error.
func AwaitClose(t testing.TB, closed <-chan *amqp.Error, d time.Duration) *amqp.Error {
	t.Helper()
	select {
	case e, ok := <-closed:
		if !ok || e == nil {
			t.Fatal("testbroker: closed without an error")
		}
		return e
	case <-time.After(d):
		t.Fatalf("testbroker: still open after %v", d)
	}
	return nil
}
