package testbroker

import (
	"os"
	"path/filepath"
	"testing"
)

// DefaultURL43 is used when AMQP_URL_43 is not set: the RabbitMQ 4.3 that
// .ci/rabbitmq43 runs.
const DefaultURL43 = "amqp://guest:guest@127.0.0.1:5682/"

// Broker is one RabbitMQ the tests run against.
type Broker struct {
	// Name is the broker's RabbitMQ version, "3.10" or "4.3": the name of
	// its subtests (Each) and the key of per-broker expectations.
	Name string
	// URL is its AMQP URL, with credentials and vhost.
	URL string
	// ctl is its rabbitmqctl: a command name or path.
	ctl string
}

// Default is the broker every test runs against: RabbitMQ 3.10 at AMQP_URL
// (or DefaultURL), with the machine's rabbitmqctl. It fails the test when
// the broker is unreachable.
func Default(t testing.TB) Broker {
	t.Helper()
	return Broker{
		Name: "3.10",
		URL:  reachable(t, "AMQP_URL", envOr("AMQP_URL", DefaultURL), "rabbitmq-server -detached"),
		ctl:  "rabbitmqctl",
	}
}

// Brokers is both brokers, Default's RabbitMQ 3.10 and RabbitMQ 4.3 at
// AMQP_URL_43 (or DefaultURL43) with the repository's .ci/rabbitmqctl43.
// It fails the test when either is unreachable.
func Brokers(t testing.TB) []Broker {
	t.Helper()
	v43 := Broker{
		Name: "4.3",
		URL:  reachable(t, "AMQP_URL_43", envOr("AMQP_URL_43", DefaultURL43), "bash .ci/rabbitmq43"),
		ctl:  filepath.Join(repoRoot(t), ".ci", "rabbitmqctl43"),
	}
	return []Broker{Default(t), v43}
}

// Addr is the broker's host:port (Addr of its URL).
func (b Broker) Addr(t testing.TB) string {
	t.Helper()
	return Addr(t, b.URL)
}

// Each runs f on each broker as a parallel subtest of t named after it.
func Each(t *testing.T, f func(t *testing.T, b Broker)) {
	t.Helper()
	for _, b := range Brokers(t) {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// EachInTurn runs f on each broker as a subtest of t named after it, one
// after the other: for tests that disturb the broker they run on.
func EachInTurn(t *testing.T, f func(t *testing.T, b Broker)) {
	t.Helper()
	for _, b := range Brokers(t) {
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// envOr is the environment variable name, or def when it is empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// repoRoot is the repository's top directory: the nearest directory at or
// above the test's working directory (its package's) that holds go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			t.Fatalf("testbroker: no go.mod at or above %s", wd)
		}
	}
}
