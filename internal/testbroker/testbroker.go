// Package testbroker gives tests the real RabbitMQ they run against. There
// are two: RabbitMQ 3.10 at AMQP_URL, the broker of every test (Default,
// URL, Ctl), and RabbitMQ 4.3 at AMQP_URL_43, beside it for the tests that
// run on each broker (Brokers, Each). For either it gives the address,
// client connections and channels (Dial, Channel, to it or to a proxy in
// front of it), one-off channels for setup and cleanup (WithChannel,
// DeclareQueue, DeleteQueue, DeleteExchange), and its rabbitmqctl (Ctl,
// AddUser, CloseConnections). A test that needs a broker fails when it is
// unreachable: it never skips, so CI cannot pass without having talked to
// RabbitMQ.
package testbroker

import (
	"crypto/rand"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/amqpurl"
)

// DefaultURL is used when AMQP_URL is not set.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns the default broker's URL, AMQP_URL (or DefaultURL), after
// checking that the broker accepts TCP connections; it fails the test when
// it does not.
func URL(t testing.TB) string {
	t.Helper()
	return Default(t).URL
}

// reachable returns u after checking that the broker it names accepts TCP
// connections; it fails the test when it does not, naming env (the
// variable u came from) and how to start the broker.
func reachable(t testing.TB, env, u, start string) string {
	t.Helper()
	host := Addr(t, u)
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatalf("testbroker: RabbitMQ at %s (%s) is not reachable (start it with `%s`): %v", host, env, start, err)
	}
	c.Close()
	return u
}

// Addr is the host:port of an AMQP URL, with AMQP's default ports.
func Addr(t testing.TB, rawURL string) string {
	t.Helper()
	e, err := amqpurl.Parse(rawURL, nil)
	if err != nil {
		t.Fatalf("testbroker: AMQP URL %q: %v", redacted(rawURL), err)
	}
	return e.HostPort
}

// UniqueName is an exchange or queue name no other test, run or machine
// shares: "dp-test.<test name>.<kind>.<random>".
func UniqueName(t testing.TB, kind string) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	n := strings.NewReplacer("/", ".", " ", "_", "#", "_", "*", "_").Replace(t.Name())
	return fmt.Sprintf("dp-test.%s.%s.%x", n, kind, b)
}
