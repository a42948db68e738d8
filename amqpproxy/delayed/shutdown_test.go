package delayed_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// nopScheduler is the Scheduler of a proxy that never releases: these
// tests look at what was stored. Nothing being in flight, it deletes
// exchanges straight from the store.
type nopScheduler struct{ st store.Store }

func (nopScheduler) Added(...*store.Message) {}
func (nopScheduler) Cancelled(...store.Key)  {}
func (s nopScheduler) DeleteExchange(ctx context.Context, vhost, name string) error {
	_, err := s.st.DeleteExchange(ctx, vhost, name)
	return err
}

// relay is an amqpproxy.Server with the delayed-exchange interceptor over
// a real store, in front of the test broker.
type relay struct {
	srv    *amqpproxy.Server
	icpt   *delayed.Interceptor
	st     *boltstore.Store
	url    string // the proxy's URL with the broker's credentials
	served chan error
	once   sync.Once
}

// startRelay starts a relay; it is closed in t.Cleanup (see relay.close).
func startRelay(t *testing.T) *relay {
	t.Helper()
	st := teststore.Open(t, "", boltstore.Options{}) // checked after r.close
	log := testlog.New()
	icpt := delayed.New(delayed.Config{Store: st, Scheduler: nopScheduler{st}, Logger: log})
	srv, err := amqpproxy.New(amqpproxy.Config{Upstream: testbroker.URL(t), Interceptor: icpt, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = l.Addr().String()
	r := &relay{srv: srv, icpt: icpt, st: st, url: u.String(), served: make(chan error, 1)}
	go func() { r.served <- srv.Serve(l) }()
	t.Cleanup(func() { r.close(t) })
	return r
}

// close closes the server (if Shutdown did not) and waits for the
// interceptor.
func (r *relay) close(t *testing.T) {
	r.once.Do(func() {
		r.srv.Close()
		if err := <-r.served; !errors.Is(err, amqpproxy.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
		r.icpt.Close()
	})
}

// storedIDs lists the message-ids stored for a delayed exchange in "/".
func (r *relay) storedIDs(t *testing.T, exchange string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	var after store.Key
	for {
		page, err := r.st.List("/", exchange, after, 10000, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page {
			ids[m.MessageID] = true
		}
		if len(page) == 0 {
			return ids
		}
		after = page[len(page)-1].Key
	}
}

// declareDelayed declares a delayed direct exchange through the proxy and
// deletes it on the broker in t.Cleanup.
func declareDelayed(t *testing.T, proxyURL string) string {
	t.Helper()
	name := fmt.Sprintf("dp-delayed.%s.%d", t.Name(), time.Now().UnixNano())
	testbroker.WithChannel(t, proxyURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, delayed.TypeDelayed, false, false, false, false, amqp.Table{"x-delayed-type": "direct"})
	})
	t.Cleanup(func() { testbroker.DeleteExchange(t, name) })
	return name
}

// TestShutdownConfirmsEveryStoredPublish: pipelined confirm-mode publishers
// on a delayed exchange, Server.Shutdown mid-stream: every publish the
// proxy stored was confirmed to its client before 320 CONNECTION_FORCED,
// and everything confirmed was stored.
func TestShutdownConfirmsEveryStoredPublish(t *testing.T) {
	t.Parallel()
	r := startRelay(t)
	ex := declareDelayed(t, r.url)

	const publishers = 4
	pubs := crashtest.StartPublishers(publishers, func(n int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name:     fmt.Sprintf("dp-delayed shutdown %d", n),
			URL:      func() string { return r.url },
			Exchange: ex,
			Delay:    func(uint64) time.Duration { return time.Hour },
			Window:   64,
		}
	})
	t.Cleanup(func() { pubs.Stop() })
	deadline := time.Now().Add(20 * time.Second)
	for pubs.Confirmed() < 500 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	testwait.Until(t, 15*time.Second, "every publisher to see its connection closed", func() bool {
		return pubs.Every(func(l crashtest.Ledger) bool { return len(l.Ends) > 0 })
	})
	ledgers := pubs.Stop()
	r.icpt.Wait() // every publish the interceptor took is stored or failed
	stored := r.storedIDs(t, ex)
	r.close(t)

	confirmed := map[string]bool{}
	for n, l := range ledgers {
		if l.Hung > 0 {
			t.Errorf("publisher %d: %d publishes neither answered nor closed", n, l.Hung)
		}
		if e := l.Ends[0].Err; e == nil || e.Code != amqp.ConnectionForced {
			t.Errorf("publisher %d: closed with %v, want 320 CONNECTION_FORCED", n, e)
		}
		for _, id := range l.Confirmed {
			confirmed[id] = true
		}
	}
	var storedNotConfirmed, confirmedNotStored []string
	for id := range stored {
		if !confirmed[id] {
			storedNotConfirmed = append(storedNotConfirmed, id)
		}
	}
	for id := range confirmed {
		if !stored[id] {
			confirmedNotStored = append(confirmedNotStored, id)
		}
	}
	if len(storedNotConfirmed) > 0 {
		t.Errorf("%d stored publishes never confirmed to their client (a republishing client duplicates them), e.g. %v",
			len(storedNotConfirmed), storedNotConfirmed[:min(5, len(storedNotConfirmed))])
	}
	if len(confirmedNotStored) > 0 {
		t.Errorf("%d confirmed publishes not stored, e.g. %v", len(confirmedNotStored), confirmedNotStored[:min(5, len(confirmedNotStored))])
	}
	if len(confirmed) < 500 {
		t.Errorf("only %d confirmed before Shutdown", len(confirmed))
	}
	t.Logf("confirmed %d, stored %d", len(confirmed), len(stored))
}
