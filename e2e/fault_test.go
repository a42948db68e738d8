//go:build brokerfaults

package e2e

// Tests that stop RabbitMQ or load it for minutes. They disrupt every other
// test on the machine, so CI runs them separately and serially:
//
//	go test -race -tags brokerfaults -p 1 -run '^TestFault' ./...

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// stopBroker stops broker b's RabbitMQ application (the Erlang node stays
// up); it is started again in t.Cleanup whatever happens.
func stopBroker(t *testing.T, b testbroker.Broker) {
	t.Helper()
	t.Cleanup(func() { startBroker(t, b) })
	b.Ctl(t, "stop_app")
}

// startBroker starts broker b's RabbitMQ application and waits until it
// accepts AMQP connections again.
func startBroker(t testing.TB, b testbroker.Broker) {
	t.Helper()
	b.Ctl(t, "start_app")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, err := amqp.Dial(b.URL)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("RabbitMQ does not accept connections 2 minutes after start_app: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFaultBrokerStopDuringRelease: RabbitMQ's application is stopped while
// messages are being released and started again, on each broker in turn:
// nothing is lost, and release resumes. Duplicates are allowed, bounded by
// the releases in flight when RabbitMQ went away (one batch, 256).
func TestFaultBrokerStopDuringRelease(t *testing.T) {
	testbroker.EachInTurn(t, func(t *testing.T, b testbroker.Broker) {
		const n = 3000
		tp, ch := startConfirmedOn(t, b)
		ex, q := delayedQueueOn(t, b, ch, "fanout", "") // durable; messages are persistent

		confirms := make([]*amqp.DeferredConfirmation, n)
		for i := range n {
			// Spread over 0.3-6.3 s.
			ms := int32(300 + (i*7919)%6000)
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "", false, false, delayedMsg(ms, fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			confirms[i] = dc
		}
		for i, dc := range confirms {
			if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
				t.Fatalf("publish %d: ack=%v err=%v", i, ok, err)
			}
		}
		testwait.Until(t, 20*time.Second, "releases to begin", func() bool { return b.QueueDepth(t, q) > 0 })
		pendingBefore := tp.pending(t, ex)
		stopBroker(t, b) // takes a few seconds
		// Releases RabbitMQ confirmed before it stopped leave the store after
		// the delete linger; nothing is confirmed from here on.
		time.Sleep(2*delayproxy.ReleaseDeleteLinger + 100*time.Millisecond)
		pendingAtStop := tp.pending(t, ex)
		releasedAtStop := tp.metric(t, "delayproxy_messages_released_total")
		// Stay down until messages have been due for a second and could not
		// be released.
		testwait.Until(t, 30*time.Second, "messages to fall due while RabbitMQ is down", func() bool {
			due, ok := tp.nextDue(t, ex)
			return ok && time.Since(due) > time.Second
		})
		if p := tp.pending(t, ex); p != pendingAtStop {
			t.Fatalf("pending went from %d to %d while RabbitMQ was down", pendingAtStop, p)
		}
		if r := tp.metric(t, "delayproxy_messages_released_total"); r != releasedAtStop {
			t.Fatalf("released_total went from %v to %v while RabbitMQ was down", releasedAtStop, r)
		}
		startBroker(t, b)
		restarted := time.Now()
		testwait.Until(t, 2*time.Minute, "every message to be released", func() bool { return tp.pending(t, ex) == 0 })
		resumed := time.Since(restarted)

		got := drainOn(t, b, q)
		count := map[string]int{}
		for _, d := range got {
			count[d.MessageId]++
		}
		dups := 0
		for i := range n {
			switch c := count[fmt.Sprint(i)]; {
			case c == 0:
				t.Errorf("message %d lost", i)
			case c > 1:
				dups += c - 1
			}
		}
		if dups > 256 {
			t.Errorf("%d duplicates, more than one release batch", dups)
		}
		t.Logf("%d pending when stop_app began, %d when it returned; all released %v after RabbitMQ was back; %d duplicates",
			pendingBefore, pendingAtStop, resumed, dups)
		// The releaser dialled again after its connection died under a release
		// batch; the metric must say so.
		if r := tp.metric(t, "delayproxy_upstream_reconnects_total"); r < 1 {
			t.Errorf("upstream_reconnects_total = %v after RabbitMQ restarted", r)
		}
	})
}

// TestFaultBurst100k: 100,000 messages due at one millisecond, priorities
// 0-9, arrive by priority then publish order (TestRelease_BurstSameMillisecondByPriority
// with 100,000: it takes over a minute with -race on 2 cores, so it runs on
// the default broker only).
func TestFaultBurst100k(t *testing.T) {
	testBurst(t, testbroker.Default(t), 100_000)
}
