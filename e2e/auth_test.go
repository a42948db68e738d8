package e2e

import (
	"net/url"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// withUser is u with another user's credentials.
func withUser(t testing.TB, u, user, pass string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	p.User = url.UserPassword(user, pass)
	return p.String()
}

// refusedReason publishes one delayed message on a fresh channel of conn
// and returns the reason of the channel error it is refused with.
func refusedReason(t testing.TB, conn *amqp.Connection, exchange, key string) string {
	t.Helper()
	ch := testbroker.Channel(t, conn)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	publish(t, ch, exchange, key, delayedMsg(100, "refused"))
	e := testbroker.AwaitClose(t, closed, 15*time.Second)
	if e.Code != amqp.AccessRefused {
		t.Fatalf("publish to %s (%q) closed the channel with %v, want 403", exchange, key, e)
	}
	return e.Reason
}

// TestAuth_DelayedPublishNeedsTheUsersPermissions: the proxy releases with
// its own account, so it asks RabbitMQ first whether the publishing user may
// write to the delayed exchange (and to the topic, for topic exchanges).
// A user allowed one exchange and, on a topic exchange, routing keys
// "allowed.*": allowed publishes are stored and released; a refused one
// closes the channel with RabbitMQ's own 403 and text (compared with a
// publish straight to RabbitMQ), nothing is stored or released, and an
// allowed publish earlier on the same connection does not let a refused
// one through.
func TestAuth_DelayedPublishNeedsTheUsersPermissions(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	suffix := randHex(t, 4)
	okEx, noEx, topicEx := "dp-authok."+suffix, "dp-authno."+suffix, "dp-authok.topic."+suffix
	guest := testbroker.Channel(t, tp.dial(t))
	for _, x := range []struct{ name, typ string }{{okEx, "direct"}, {noEx, "direct"}, {topicEx, "topic"}} {
		if err := guest.ExchangeDeclare(x.name, "x-delayed-message", false, false, false, false, amqp.Table{"x-delayed-type": x.typ}); err != nil {
			t.Fatalf("declare %s: %v", x.name, err)
		}
		t.Cleanup(func() { testbroker.DeleteExchange(t, x.name) })
	}
	q := testbroker.DeclareQueue(t, true, nil)
	bind(t, q, "k", okEx, nil)
	bind(t, q, "k", noEx, nil)
	bind(t, q, "#", topicEx, nil)

	user, pass := "dp-auth-"+suffix, randHex(t, 8)
	testbroker.AddUser(t, user, pass)
	testbroker.Ctl(t, "set_permissions", "-p", "/", user, "", `^dp-authok\.`, "")
	testbroker.Ctl(t, "set_topic_permissions", "-p", "/", user, topicEx, `^allowed\.`, ".*")

	conn := testbroker.Dial(t, withUser(t, tp.URL(), user, pass))
	direct := testbroker.Dial(t, withUser(t, testbroker.URL(t), user, pass))

	// Allowed, then refused on the same connection.
	publishConfirmed(t, confirmChannel(t, conn), okEx, "k", false, delayedMsg(200, "ok-direct"))
	got := refusedReason(t, conn, noEx, "k")
	want := refusedReason(t, direct, noEx, "k")
	if got != want {
		t.Errorf("refused exchange: proxy says %q, RabbitMQ says %q", got, want)
	}
	if exp := "ACCESS_REFUSED - access to exchange '" + noEx + "' in vhost '/' refused for user '" + user + "'"; got != exp {
		t.Errorf("refused exchange: %q, want %q", got, exp)
	}

	// Topic permission by routing key: allowed key first, then a refused
	// one on the same connection and exchange.
	publishConfirmed(t, confirmChannel(t, conn), topicEx, "allowed.a", false, delayedMsg(200, "ok-topic"))
	got = refusedReason(t, conn, topicEx, "denied.a")
	want = refusedReason(t, direct, topicEx, "denied.a")
	if got != want {
		t.Errorf("refused topic: proxy says %q, RabbitMQ says %q", got, want)
	}
	// RabbitMQ 3.10 words it "access to topic", not "write access to topic".
	if exp := "ACCESS_REFUSED - access to topic 'denied.a' in exchange '" + topicEx + "' in vhost '/' refused for user '" + user + "'"; got != exp {
		t.Errorf("refused topic: %q, want %q", got, exp)
	}
	// The connection is still usable: a refusal closes only its channel.
	publishConfirmed(t, confirmChannel(t, conn), topicEx, "allowed.b", false, delayedMsg(200, "ok-topic-2"))

	if n := tp.pending(t, noEx); n != 0 {
		t.Errorf("refused exchange holds %d messages, want 0", n)
	}
	if n := tp.metric(t, `delayproxy_messages_refused_total{reason="forbidden"}`); n != 2 {
		t.Errorf(`messages_refused_total{reason="forbidden"} = %v, want the 2 refused`, n)
	}
	// The allowed ones are released; the refused ones never were stored,
	// so only the allowed three can arrive.
	testwait.Until(t, 15*time.Second, "the allowed messages released", func() bool {
		return tp.pending(t, okEx) == 0 && tp.pending(t, topicEx) == 0 && queueDepth(t, q) >= 3
	})
	var ids []string
	for _, d := range drain(t, q) {
		ids = append(ids, d.MessageId)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"ok-direct", "ok-topic", "ok-topic-2"}) {
		t.Errorf("released %v, want the three allowed", ids)
	}
}
