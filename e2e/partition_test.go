//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/netns"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// Silent partitions (issue 13): a hop of the proxy crosses a veth link to a
// network namespace of the test's (internal/netns), and the link is cut:
// every packet dropped, no reset, as when a peer's host vanishes. RabbitMQ's
// answer to that is heartbeats; the proxy's must be the same on each hop.

const (
	// partitionHeartbeat is the proxy's --heartbeat in these tests: both
	// hops of a client connection are tuned to it.
	partitionHeartbeat = 2 * time.Second
	// releaserHeartbeat is the heartbeat of the releaser's connections:
	// releaser.Config's default, which delayproxy keeps (RabbitMQ offers
	// 60 s, and the shorter wins).
	releaserHeartbeat = 10 * time.Second
	// detectSlack is what noticing a silent peer may take beyond two
	// heartbeat intervals on a loaded machine: timers, scheduling, the log.
	detectSlack = time.Second
	// resumeWithin bounds the wait for the first confirmed release once the
	// link is back: the scheduler's first retry backoff and a dial, whose
	// SYN may wait for its retransmission (1 s, 3 s) if it left before.
	resumeWithin = 10 * time.Second
)

// TestPartition_ClientProxy: a client reaches the proxy across the link
// (its socket is inside the namespace) and the link is cut. The proxy
// notices within two heartbeat intervals, as RabbitMQ would, and closes
// the client's upstream connection: RabbitMQ lists it no more. The client,
// amqp091-go, notices by its own rule (1.5 intervals without a frame).
// A delayed message confirmed before the cut is released all the same.
func TestPartition_ClientProxy(t *testing.T) {
	t.Parallel()
	link := netns.New(t)
	logs := &lockedBuffer{}
	tp := startProxyWith(t, func(c *delayproxy.Config) {
		c.ListenAddr = netip.AddrPortFrom(link.Host, 0).String()
		c.Heartbeat = partitionHeartbeat
	}, slog.New(slog.NewJSONHandler(logs, nil)))
	t.Cleanup(func() { link.Restore(t) }) // before the proxy stops
	dumpLogOnFailure(t, logs)

	name := "dp-e2e partition client " + randHex(t, 4)
	conn := dialAcross(t, link, tp.URL(), name)
	closed := watchClose(conn)
	ch := confirmChannel(t, conn)
	ex, _, got := delayedFanoutOn(t, testbroker.Default(t), ch)
	publishConfirmed(t, ch, ex, "", false, delayedMsg(3000, "confirmed-before-the-cut"))
	if !brokerLists(t, name) {
		t.Fatalf("RabbitMQ does not list the upstream connection %q", name)
	}

	cut := time.Now()
	link.Cut(t)
	proxySaw := awaitLog(t, logs, "client missed heartbeats, closing", cut, 2*partitionHeartbeat+detectSlack)
	sessionEnded := awaitLog(t, logs, "client connection closed", cut, 2*partitionHeartbeat+detectSlack)
	var client closeSeen
	select {
	case client = <-closed:
	case <-time.After(time.Until(cut.Add(2*partitionHeartbeat + detectSlack))):
		t.Fatalf("amqp091-go still sees its connection open %v after the cut", time.Since(cut).Round(time.Millisecond))
	}
	testwait.Until(t, 15*time.Second, "RabbitMQ to drop the upstream connection", func() bool { return !brokerLists(t, name) })
	t.Logf("heartbeat %v; cut at 0: the proxy noticed at %v and ended the session (upstream closed) at %v; amqp091-go noticed at %v (%v)",
		partitionHeartbeat, since(cut, proxySaw), since(cut, sessionEnded), since(cut, client.at), client.err)

	link.Restore(t)
	if a := got.wait(t, 1, 15*time.Second)[0]; a.MessageId != "confirmed-before-the-cut" {
		t.Errorf("released %q, want confirmed-before-the-cut", a.MessageId)
	}
}

// TestPartition_ProxyBroker: the proxy reaches RabbitMQ across the link (a
// forwarder inside the namespace relays to RabbitMQ), for its client
// connections and its releaser alike, and the link is cut while clients
// publish delayed messages and releases go on. The proxy notices within
// two heartbeat intervals of the client connections and closes each with
// 320 CONNECTION_FORCED; the releaser notices within two intervals of its
// own heartbeat; nothing is released while the link is down. Once it is
// back, release resumes, the clients connect again, and every message
// confirmed before or after is delivered, duplicates within the releases
// in flight.
func TestPartition_ProxyBroker(t *testing.T) {
	t.Parallel()
	link := netns.New(t)
	brokerURL := testbroker.URL(t)
	bu, err := amqp.ParseURI(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	upstream := link.Forward(t, net.JoinHostPort(bu.Host, strconv.Itoa(bu.Port)))
	logs := &lockedBuffer{}
	tp := startProxyWith(t, func(c *delayproxy.Config) {
		c.UpstreamURL = withHost(t, brokerURL, upstream, "")
		c.Heartbeat = partitionHeartbeat
	}, slog.New(slog.NewJSONHandler(logs, nil)))
	t.Cleanup(func() { link.Restore(t) }) // before the proxy stops
	dumpLogOnFailure(t, logs)

	idle := tp.dial(t)
	idleClosed := idle.NotifyClose(make(chan *amqp.Error, 1))
	ex, q := delayedQueue(t, testbroker.Channel(t, idle), "fanout", "")
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)
	prefix := "dp-e2e partition " + randHex(t, 4)
	pubs := crashtest.StartPublishers(2, func(i int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name:     fmt.Sprintf("%s %d", prefix, i),
			URL:      tp.URL,
			Exchange: ex,
			Delay:    delaySpread(uint64(i), 300*time.Millisecond, 2*time.Second, 4*time.Second, 4*time.Second),
			Rate:     50,
		}
	})
	testwait.Until(t, 30*time.Second, "releases to be under way", func() bool { return len(got.snapshot()) >= 40 })

	cut := time.Now()
	link.Cut(t)
	// Client connections: RabbitMQ's heartbeats stop reaching the proxy.
	e := testbroker.AwaitClose(t, idleClosed, 2*partitionHeartbeat+detectSlack)
	idleSaw := time.Now()
	if e.Code != amqp.ConnectionForced {
		t.Errorf("idle client's connection closed with %v, want 320 CONNECTION_FORCED", e)
	}
	for i, end := range awaitEnds(t, pubs, cut, cut.Add(2*partitionHeartbeat+detectSlack)) {
		if end.Err == nil || end.Err.Code != amqp.ConnectionForced {
			t.Errorf("publisher %d: connection ended with %v, want 320 CONNECTION_FORCED", i, end.Err)
		}
		t.Logf("publisher %d: closed %v after the cut: %v", i, since(cut, end.At), end.Err)
	}
	t.Logf("heartbeat %v; cut at 0: the idle client got %v at %v", partitionHeartbeat, e, since(cut, idleSaw))

	// The releaser: RabbitMQ's acks and heartbeats stop.
	relSaw := awaitLog(t, logs, "release connection lost", cut, 2*releaserHeartbeat+detectSlack)
	healed := time.Now()
	if n := arrivedAfter(got, cut.Add(500*time.Millisecond)); n > 0 {
		// What RabbitMQ routed before the cut reaches the consumer (on
		// loopback) at once; nothing else can.
		t.Errorf("%d messages arrived while the link was cut", n)
	}
	released := tp.metric(t, "delayproxy_messages_released_total")
	link.Restore(t)
	// Confirmed releases, not arrivals: once the link is back, the kernel
	// of the closed release socket may still deliver what it held.
	testwait.Until(t, resumeWithin, "release to resume", func() bool {
		return tp.metric(t, "delayproxy_messages_released_total") > released
	})
	resumed := time.Now()
	t.Logf("releaser heartbeat %v: it noticed at %v; link restored at %v, release resumed %v later",
		releaserHeartbeat, since(cut, relSaw), since(cut, healed), resumed.Sub(healed).Round(time.Millisecond))

	before := pubs.Confirmed()
	testwait.Until(t, 30*time.Second, "clients to publish again", func() bool {
		return pubs.Every(func(l crashtest.Ledger) bool { return l.Sessions >= 2 }) && pubs.Confirmed() >= before+50
	})
	ls := pubs.Stop()
	awaitDelivered(t, got, pubs, 30*time.Second)
	testwait.Until(t, 30*time.Second, "nothing pending", func() bool { return tp.pending(t, ex) == 0 })
	tally := crashtest.Count(ls, messageIDs(got.stop(t)))
	t.Logf("%v", tally)
	if err := tally.Err(delayproxy.MaxReleasesInFlight); err != nil {
		t.Error(err)
	}
}

// dialAcross connects a client (amqp091-go, heartbeat partitionHeartbeat,
// connection_name name) to the proxy at u from inside link's namespace;
// it is closed in t.Cleanup.
func dialAcross(t testing.TB, link *netns.Link, u, name string) *amqp.Connection {
	t.Helper()
	const timeout = 10 * time.Second
	c, err := amqp.DialConfig(u, amqp.Config{
		Heartbeat:  partitionHeartbeat,
		Properties: amqp.Table{"connection_name": name},
		Dial: func(network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c, err := link.Dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// As amqp.DefaultDial: a deadline for the handshake, which
			// amqp091-go clears once the connection is open.
			return c, c.SetDeadline(time.Now().Add(timeout))
		},
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", u, link.Name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closeSeen is when a client learnt that its connection closed, and why.
type closeSeen struct {
	at  time.Time
	err *amqp.Error
}

// watchClose reports c's close as the client learns it.
func watchClose(c *amqp.Connection) <-chan closeSeen {
	seen := make(chan closeSeen, 1)
	closed := c.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		e := <-closed
		seen <- closeSeen{time.Now(), e}
	}()
	return seen
}

// brokerLists reports whether RabbitMQ lists a connection named name.
func brokerLists(t testing.TB, name string) bool {
	t.Helper()
	return strings.Contains(testbroker.Ctl(t, "list_connections", "client_properties"),
		`{"connection_name","`+name+`"}`)
}

// awaitLog waits for the proxy's log (JSON lines in logs) to hold a line
// with message msg logged after since, and returns when it was logged. It
// fails the test when the line was logged later than within, or not at all
// by then and a few seconds more.
func awaitLog(t testing.TB, logs *lockedBuffer, msg string, since time.Time, within time.Duration) time.Time {
	t.Helper()
	giveUp := since.Add(within + 5*time.Second)
	for {
		if at, ok := loggedAt(t, logs.String(), msg, since); ok {
			if at.Sub(since) > within {
				t.Errorf("%q logged %v after the cut, want within %v", msg, at.Sub(since).Round(time.Millisecond), within)
			}
			return at
		}
		if time.Now().After(giveUp) {
			t.Fatalf("no %q in the proxy's log %v after the cut", msg, time.Since(since).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// loggedAt is the time of the first line with message msg logged after
// since.
func loggedAt(t testing.TB, text, msg string, since time.Time) (time.Time, bool) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r logRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", sc.Text(), err)
		}
		if r.str("msg") != msg {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, r.str("time"))
		if err != nil {
			t.Fatalf("log line's time: %v", err)
		}
		if at.After(since) {
			return at, true
		}
	}
	return time.Time{}, false
}

// dumpLogOnFailure logs the proxy's log at the end of a failed test.
func dumpLogOnFailure(t testing.TB, logs *lockedBuffer) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
}

// arrivedAfter counts c's arrivals after at.
func arrivedAfter(c *consumer, at time.Time) int {
	n := 0
	for _, a := range c.snapshot() {
		if a.At.After(at) {
			n++
		}
	}
	return n
}

// since is at's distance from from, rounded for a log line.
func since(from, at time.Time) time.Duration { return at.Sub(from).Round(time.Millisecond) }
