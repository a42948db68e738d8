//go:build brokerfaults

package amqpproxy

// Tests that disturb the whole broker (its memory alarm blocks every
// publisher on it). CI runs them separately and serially:
//
//	go test -race -tags brokerfaults -p 1 -run '^TestFault' ./...

import (
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestFaultConnectionBlocked sets RabbitMQ's memory alarm: connection.blocked
// and unblocked reach the client. Not parallel, and the alarm is always
// cleared: it blocks every publisher on the broker.
func TestFaultConnectionBlocked(t *testing.T) {
	p := startProxy(t, Config{})
	q := declareQueue(t, nil)
	conn := p.dial(t, amqp.Config{})
	ch := testbroker.Channel(t, conn)
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	t.Cleanup(func() { testbroker.Ctl(t, "set_vm_memory_high_watermark", "0.4") })
	testbroker.Ctl(t, "set_vm_memory_high_watermark", "0.0000001")
	// RabbitMQ blocks a connection (and says so) when it next publishes.
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("held back")})
	select {
	case b := <-blocked:
		if !b.Active || !strings.Contains(b.Reason, "memory") {
			t.Fatalf("blocked %+v", b)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no connection.blocked")
	}
	testbroker.Ctl(t, "set_vm_memory_high_watermark", "0.4")
	select {
	case b := <-blocked:
		if b.Active {
			t.Fatalf("unblocked %+v", b)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no connection.unblocked")
	}
	if d := get(t, ch, q); string(d.Body) != "held back" {
		t.Fatalf("got %q", d.Body)
	}
}
