package e2e

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// closePrompt is how soon after RabbitMQ closed its upstream connection a
// client must learn that its connection through the proxy is closed.
const closePrompt = 5 * time.Second

// TestReliabilityUpstream_ClientConnectionClosed: RabbitMQ closes the
// upstream connections of clients that are publishing delayed messages
// (rabbitmqctl close_connection, found by the client's connection_name,
// which the proxy passes on). Each client learns promptly, with RabbitMQ's
// 320 CONNECTION_FORCED, dials again through the proxy and goes on; every
// message it saw confirmed, before or after, is delivered.
func TestReliabilityUpstream_ClientConnectionClosed(t *testing.T) {
	t.Parallel()
	const clients = 2
	tp := startProxy(t, nil)
	ex, q := delayedQueue(t, testbroker.Channel(t, tp.dial(t)), "fanout", "")
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)

	prefix := "dp-rel upstream " + randHex(t, 4)
	pubs := startClients(clients, prefix, tp.URL, ex, 100, spread{300 * time.Millisecond, 1500 * time.Millisecond, 2 * time.Second, time.Second})
	awaitConfirmedEach(t, pubs, 20)
	before := pubs.Confirmed()
	closing := time.Now()
	if n := testbroker.CloseConnections(t, prefix); n != clients {
		t.Fatalf("closed %d upstream connections named %q..., want %d", n, prefix, clients)
	}
	closed := time.Now()
	// Each client saw its connection end, with RabbitMQ's code, no later
	// than closePrompt after the last close_connection returned.
	for i, end := range awaitEnds(t, pubs, closing, closed.Add(closePrompt)) {
		if end.Err == nil || end.Err.Code != amqp.ConnectionForced {
			t.Errorf("client %d: connection ended with %v, want 320 CONNECTION_FORCED from RabbitMQ", i, end.Err)
		}
		t.Logf("client %d: connection closed %v after close_connection began (%v for rabbitmqctl): %v",
			i, end.At.Sub(closing).Round(time.Millisecond), closed.Sub(closing).Round(time.Millisecond), end.Err)
	}
	// And goes on publishing over a new connection.
	testwait.Until(t, 30*time.Second, "clients to publish again", func() bool {
		reconnected := pubs.Every(func(l crashtest.Ledger) bool { return l.Sessions >= 2 })
		return reconnected && pubs.Confirmed() >= before+100
	})
	ls := pubs.Stop()
	awaitDelivered(t, got, pubs, 3*time.Second+30*time.Second)
	testwait.Until(t, 30*time.Second, "nothing pending", func() bool { return tp.pending(t, ex) == 0 })
	tally := crashtest.Count(ls, messageIDs(got.stop(t)))
	t.Logf("%v", tally)
	// The store is not touched by the fault: no duplicates at all.
	if err := tally.Err(0); err != nil {
		t.Error(err)
	}
}

// TestReliabilityUpstream_ReleaserConnectionClosed: RabbitMQ closes the
// releaser's connection while messages are being released. Release resumes
// on a new connection; nothing is lost; duplicates (releases RabbitMQ
// routed whose confirm died with the connection, published again) stay
// within the releases in flight (MaxReleasesInFlight).
//
// The test has a vhost of its own so that it closes its proxy's releaser
// connection ("delayproxy releaser <vhost>") and no other test's. Clients
// publish short delays all along, so releases go on however long
// rabbitmqctl takes.
func TestReliabilityUpstream_ReleaserConnectionClosed(t *testing.T) {
	t.Parallel()
	const clients = 2
	vh := testbroker.VHost(t, "dp-rel-")
	brokerURL := withVHost(t, testbroker.URL(t), vh)
	tp := startProxy(t, nil)
	proxyURL := withVHost(t, tp.URL(), vh)

	q := "dp-rel.releaser." + randHex(t, 4)
	testbroker.WithChannel(t, brokerURL, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		return err
	})
	pch := testbroker.Channel(t, testbroker.Dial(t, proxyURL))
	ex := "dp-rel.releaser.x"
	if err := pch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "fanout"}); err != nil {
		t.Fatal(err)
	}
	testbroker.WithChannel(t, brokerURL, func(ch *amqp.Channel) error { return ch.QueueBind(q, "", ex, false, nil) })
	got := consume(t, testbroker.Dial(t, brokerURL), q)

	prefix := "dp-rel releaser-test " + randHex(t, 4)
	pubs := startClients(clients, prefix, func() string { return proxyURL }, ex, 150, spread{200 * time.Millisecond, time.Second, time.Second, time.Second})
	testwait.Until(t, 30*time.Second, "releases to begin", func() bool { return len(got.snapshot()) >= 200 })
	releaser := "delayproxy releaser " + vh
	if k := testbroker.CloseConnections(t, releaser); k != 1 {
		t.Fatalf("closed %d connections named %q, want 1", k, releaser)
	}
	at := len(got.snapshot())
	testwait.Until(t, 30*time.Second, "releases to resume", func() bool { return len(got.snapshot()) >= at+200 })
	ls := pubs.Stop()
	testwait.Until(t, 30*time.Second, "every message to be released", func() bool { return tp.exchangeIn(t, vh, ex).Pending == 0 })
	awaitDelivered(t, got, pubs, 30*time.Second)
	tally := crashtest.Count(ls, messageIDs(got.stop(t)))
	t.Logf("releaser connection closed with %d delivered: %v", at, tally)
	if err := tally.Err(delayproxy.MaxReleasesInFlight); err != nil {
		t.Error(err)
	}
	if tally.Nacked > 0 || tally.Unanswered > 0 {
		t.Errorf("clients' publishes disturbed by the releaser's connection")
	}
	if r := tp.metric(t, "delayproxy_upstream_reconnects_total"); r < 1 {
		// A connection that dies under a batch is dropped there, so the
		// count must not depend on finding it dead at the next dial.
		t.Errorf("upstream_reconnects_total = %v after the releaser's connection was closed mid-release and dialled again", r)
	}
	// Delete the delayed exchange through the proxy, so that its registry
	// forgets it before the vhost goes.
	if err := pch.ExchangeDelete(ex, false, false); err != nil {
		t.Errorf("delete %s: %v", ex, err)
	}
}
