//go:build brokerfaults

package e2e

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// TestFaultBrokerStopDuringPublish: RabbitMQ's application stops while
// clients publish delayed messages through the proxy and earlier ones are
// being released, on each broker in turn. Every client learns promptly that its connection is
// closed (320 CONNECTION_FORCED); while RabbitMQ is down their dials
// through the proxy fail at once rather than hang; when it is back they
// connect and publish again, and every message confirmed before or after
// is delivered, with duplicates within one release window.
// TestFaultBrokerStopDuringRelease (fault_test.go) covers the stop
// during a release burst.
func TestFaultBrokerStopDuringPublish(t *testing.T) {
	testbroker.EachInTurn(t, func(t *testing.T, b testbroker.Broker) {
		const clients = 3
		tp := startProxyOn(t, b, nil)
		ex, q := delayedQueueOn(t, b, testbroker.Channel(t, tp.dial(t)), "fanout", "") // durable; messages are persistent

		prefix := "dp-rel brokerstop " + randHex(t, 4)
		pubs := startClients(clients, prefix, tp.URL, ex, 100, spread{500 * time.Millisecond, 3 * time.Second, 4 * time.Second, 2 * time.Second})
		awaitConfirmedEach(t, pubs, 30)
		stopping := time.Now()
		stopBroker(t, b)
		stopped := time.Now()
		t.Logf("stop_app took %v", stopped.Sub(stopping).Round(time.Millisecond))
		for i, end := range awaitEnds(t, pubs, stopping, stopped.Add(closePrompt)) {
			if end.Err == nil || end.Err.Code != amqp.ConnectionForced {
				t.Errorf("client %d: connection ended with %v, want 320 CONNECTION_FORCED", i, end.Err)
			}
			t.Logf("client %d: closed %v after stop_app began: %v", i, end.At.Sub(stopping).Round(time.Millisecond), end.Err)
		}
		// Down: clients keep dialling through the proxy, and each dial fails
		// at once (the proxy cannot reach RabbitMQ), never hangs.
		dials := func() (n int) {
			for _, p := range pubs.All() {
				n += p.Ledger().Dials
			}
			return n
		}
		confirmedDown := pubs.Confirmed()
		base := dials()
		testwait.Until(t, 10*time.Second, "clients to keep dialling while RabbitMQ is down", func() bool { return dials() >= base+10*clients })
		// Stay down until messages have been due for a second and could not
		// be released.
		testwait.Until(t, 30*time.Second, "messages to fall due while RabbitMQ is down", func() bool {
			due, ok := tp.nextDue(t, ex)
			return ok && time.Since(due) > time.Second
		})
		if n := pubs.Confirmed(); n != confirmedDown {
			t.Errorf("%d publishes confirmed while RabbitMQ was down", n-confirmedDown)
		}
		startBroker(t, b)
		restarted := time.Now()
		testwait.Until(t, time.Minute, "clients to publish again", func() bool {
			reconnected := pubs.Every(func(l crashtest.Ledger) bool { return l.Sessions >= 2 })
			return reconnected && pubs.Confirmed() >= confirmedDown+100
		})
		t.Logf("clients publishing again %v after start_app returned", time.Since(restarted).Round(time.Millisecond))
		ls := pubs.Stop()
		got := consume(t, testbroker.Dial(t, b.URL), q)
		awaitDelivered(t, got, pubs, time.Minute)
		testwait.Until(t, time.Minute, "nothing pending", func() bool { return tp.pending(t, ex) == 0 })
		tally := crashtest.Count(ls, messageIDs(got.stop(t)))
		t.Logf("%v; %d dials in all", tally, dials())
		if err := tally.Err(releaseWindow); err != nil {
			t.Error(err)
		}
	})
}
