package amqpproxy

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestPublishConsumeAck(t *testing.T) {
	t.Parallel()
	p := startProxy(t, Config{})
	q := declareQueue(t, nil)
	conn := p.dial(t, amqp.Config{})
	ch := channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 10))
	ctx := ctxTimeout(t, 10*time.Second)
	for i := range 3 {
		if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte{byte('a' + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		c := <-confirms
		if !c.Ack || c.DeliveryTag != uint64(i+1) {
			t.Fatalf("confirm %d = %+v", i, c)
		}
	}
	msgs, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		select {
		case m := <-msgs:
			if string(m.Body) != string(rune('a'+i)) {
				t.Fatalf("got %q", m.Body)
			}
			if err := m.Ack(false); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
	}
}
