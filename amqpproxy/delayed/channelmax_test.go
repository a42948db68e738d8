package delayed_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestChannelMaxDelayedPublishOnTheLastChannel: the permission check of a
// delayed publish takes no channel of the client's: amqp091-go negotiates
// RabbitMQ's channel_max (2047), opens every channel up to it, and
// publishes delayed messages on the last one and on the first, confirmed
// and stored; an allowed publish does not let a forbidden one through,
// and the refusal is RabbitMQ's own 403. On RabbitMQ 3.10 and 4.3.
func TestChannelMaxDelayedPublishOnTheLastChannel(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		r := startWireRelay(t, b, delayed.Config{}, amqpproxy.Config{})
		ex, _ := r.declare(t)
		conn, err := amqp.Dial(r.url("guest", "guest"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		max := int(conn.Config.ChannelMax)
		if max != 2047 {
			t.Fatalf("negotiated channel_max %d through the proxy, RabbitMQ's is 2047", max)
		}
		chans := make([]*amqp.Channel, 0, max)
		for range max {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatalf("channel %d of %d: %v", len(chans)+1, max, err)
			}
			chans = append(chans, ch)
		}
		for i, ch := range []*amqp.Channel{chans[max-1], chans[0]} {
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			for n := range 3 {
				dc, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, amqp.Publishing{
					Headers: amqp.Table{"x-delay": int32(3600_000)}, Body: fmt.Appendf(nil, "%d-%d", i, n)})
				if err != nil {
					t.Fatal(err)
				}
				if !dc.Wait() {
					t.Fatalf("delayed publish %d on channel %d nacked", n, []int{max, 1}[i])
				}
			}
		}
		if n := r.stored(t, ex); n != 6 {
			t.Fatalf("%d messages stored, want 6", n)
		}
	})
}

// TestProbeConnectionLivesWithTheSession: the probe connection is made on
// the first delayed publish (none before), is named after the client's
// (but does not start with its name: tools that find a client's
// connections by name find the client's alone) and goes when the client's
// connection does.
func TestProbeConnectionLivesWithTheSession(t *testing.T) {
	t.Parallel()
	r := startWireRelay(t, testbroker.Default(t), delayed.Config{}, amqpproxy.Config{})
	ex, _ := r.declare(t)
	name := fmt.Sprintf("dp-wire-probe-%d", time.Now().UnixNano())
	cfg := amqp.Config{Properties: amqp.Table{"connection_name": name}}
	conn, err := amqp.DialConfig(r.url("guest", "guest"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if named, starting := connectionsNamed(t, name); named != 1 || starting != 1 {
		t.Fatalf("%d connections named after %s (%d starting with it) before a delayed publish, want the client's alone", named, name, starting)
	}
	if err := ch.Publish(ex, "k", false, false, amqp.Publishing{Headers: amqp.Table{"x-delay": int32(60_000)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclarePassive(ex, false, false, false, false, nil); err != nil { // a round trip after the publish
		t.Fatal(err)
	}
	if named, starting := connectionsNamed(t, name); named != 2 || starting != 1 {
		t.Fatalf("%d connections named after %s (%d starting with it) after a delayed publish, want the client's and its probe's (the client's alone starting with it)", named, name, starting)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for named, _ := connectionsNamed(t, name); named != 0; named, _ = connectionsNamed(t, name) {
		if time.Now().After(deadline) {
			t.Fatalf("connections named %s still open after the client closed", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connectionsNamed counts RabbitMQ 3.10's connections whose
// connection_name has name in it, and those whose name starts with it.
func connectionsNamed(t *testing.T, name string) (named, starting int) {
	t.Helper()
	out := testbroker.Ctl(t, "list_connections", "client_properties")
	return strings.Count(out, name+`"}`), strings.Count(out, `{"connection_name","`+name)
}
