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

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestFaultConnectionBlocked sets RabbitMQ's memory alarm, on each broker in
// turn: connection.blocked and unblocked reach the client. Not parallel,
// and the watermark is always put back: the alarm blocks every publisher on
// the broker.
func TestFaultConnectionBlocked(t *testing.T) {
	testbroker.EachInTurn(t, func(t *testing.T, b testbroker.Broker) {
		p := startProxyOn(t, b, Config{})
		q := b.DeclareQueue(t, false, nil)
		conn := p.dial(t, amqp.Config{})
		ch := testbroker.Channel(t, conn)
		blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
		// 3.10's default is 0.4, 4.3's 0.6.
		watermark := strings.TrimSpace(b.Ctl(t, "eval", "vm_memory_monitor:get_vm_memory_high_watermark()."))
		t.Cleanup(func() { b.Ctl(t, "set_vm_memory_high_watermark", watermark) })
		b.Ctl(t, "set_vm_memory_high_watermark", "0.0000001")
		// RabbitMQ blocks a connection (and says so) when it next publishes.
		publish(t, ch, "", q, amqp.Publishing{Body: []byte("held back")})
		select {
		case bl := <-blocked:
			if !bl.Active || !strings.Contains(bl.Reason, "memory") {
				t.Fatalf("blocked %+v", bl)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no connection.blocked")
		}
		b.Ctl(t, "set_vm_memory_high_watermark", watermark)
		select {
		case bl := <-blocked:
			if bl.Active {
				t.Fatalf("unblocked %+v", bl)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no connection.unblocked")
		}
		if d := get(t, ch, q, true); string(d.Body) != "held back" {
			t.Fatalf("got %q", d.Body)
		}
	})
}
