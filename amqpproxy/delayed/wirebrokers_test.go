package delayed_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// wireBroker is one of the real brokers the wire tests of this package run
// against: RabbitMQ 3.10 (AMQP_URL) and 4.3 (AMQP_URL_43, default
// 127.0.0.1:5682, started by `bash .ci/rabbitmq43`).
type wireBroker struct {
	name string   // "3.10", "4.3"
	url  string   // amqp://guest:guest@host:port/
	addr string   // host:port
	ctl  []string // its rabbitmqctl
}

func wireBrokers(t testing.TB) []wireBroker {
	t.Helper()
	u43 := os.Getenv("AMQP_URL_43")
	if u43 == "" {
		u43 = "amqp://guest:guest@127.0.0.1:5682/"
	}
	ctl43, err := filepath.Abs("../../.ci/rabbitmqctl43")
	if err != nil {
		t.Fatal(err)
	}
	out := []wireBroker{
		{name: "3.10", url: testbroker.URL(t), ctl: []string{"rabbitmqctl"}},
		{name: "4.3", url: u43, ctl: []string{ctl43}},
	}
	for i := range out {
		pu, err := url.Parse(out[i].url)
		if err != nil {
			t.Fatal(err)
		}
		out[i].addr = pu.Host
		c, err := net.DialTimeout("tcp", pu.Host, 5*time.Second)
		if err != nil {
			t.Fatalf("RabbitMQ %s at %s is not reachable (bash .ci/rabbitmq43 starts 4.3): %v", out[i].name, pu.Host, err)
		}
		c.Close()
	}
	return out
}

// rabbitmqctl runs the broker's rabbitmqctl and fails the test if it fails.
func (b wireBroker) rabbitmqctl(t testing.TB, args ...string) {
	t.Helper()
	cmd := exec.Command(b.ctl[0], append(append(b.ctl[1:], "-q"), args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl (%s) %s: %v\n%s", b.name, strings.Join(args, " "), err, out)
	}
}

// wireRelay is an amqpproxy.Server with the delayed-exchange interceptor
// over a real store, in front of one broker.
type wireRelay struct {
	srv  *amqpproxy.Server
	icpt *delayed.Interceptor
	st   *boltstore.Store
	addr string // the proxy's host:port
	b    wireBroker
}

// startWireRelay starts a relay in front of b with the given settings (the
// store, scheduler, logger and upstream are filled in); it is closed in
// t.Cleanup.
func startWireRelay(t *testing.T, b wireBroker, dcfg delayed.Config, pcfg amqpproxy.Config) *wireRelay {
	t.Helper()
	st := teststore.Open(t, "", boltstore.Options{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("DELAYPROXY_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	dcfg.Store, dcfg.Scheduler, dcfg.Logger = st, nopScheduler{}, log
	icpt := delayed.New(dcfg)
	pcfg.Upstream, pcfg.Interceptor, pcfg.Logger = b.url, icpt, log
	srv, err := amqpproxy.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, amqpproxy.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		icpt.Close()
	})
	return &wireRelay{srv: srv, icpt: icpt, st: st, addr: l.Addr().String(), b: b}
}

// url is the proxy's URL for user and password, vhost "/" written %2f
// (which every client reads as "/").
func (r *wireRelay) url(user, pass string) string {
	return fmt.Sprintf("amqp://%s:%s@%s/%%2f", url.PathEscape(user), url.PathEscape(pass), r.addr)
}

// declare declares a delayed direct exchange through the proxy, bound to
// a new queue with key "k", and deletes both on the broker in t.Cleanup.
// It returns the exchange and the queue.
func (r *wireRelay) declare(t *testing.T) (string, string) {
	t.Helper()
	name := fmt.Sprintf("dp-wire.%s.%d", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano())
	c, err := amqp.Dial(r.url("guest", "guest"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, delayed.TypeDelayed, false, false, false, false, amqp.Table{"x-delayed-type": "direct"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "k", name, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(r.b.url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		if _, err := ch.QueueDelete(name, false, false, false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := ch.ExchangeDelete(name, false, false); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return name, name
}

// stored counts the messages stored for exchange in "/".
func (r *wireRelay) stored(t *testing.T, exchange string) int {
	t.Helper()
	page, err := r.st.List("/", exchange, store.Key{}, 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	return len(page)
}
