package delayed_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
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
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
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
	withChannel(t, proxyURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, delayed.TypeDelayed, false, false, false, false, amqp.Table{"x-delayed-type": "direct"})
	})
	t.Cleanup(func() {
		withChannel(t, testbroker.URL(t), func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
	})
	return name
}

// withChannel runs f on a fresh channel of a fresh connection to u.
func withChannel(t *testing.T, u string, f func(*amqp.Channel) error) {
	t.Helper()
	c, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := f(ch); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownConfirmsEveryStoredPublish: pipelined confirm-mode publishers
// on a delayed exchange, Server.Shutdown mid-stream: every publish the
// proxy stored was confirmed to its client before 320 CONNECTION_FORCED,
// and everything confirmed was stored.
func TestShutdownConfirmsEveryStoredPublish(t *testing.T) {
	t.Parallel()
	r := startRelay(t)
	ex := declareDelayed(t, r.url)

	const publishers, window = 4, 64
	var confirmedCount atomic.Int64
	type result struct {
		confirmed []string
		closeErr  *amqp.Error
		err       error
	}
	results := make([]result, publishers)
	var wg sync.WaitGroup
	for n := range publishers {
		wg.Go(func() {
			res := &results[n]
			conn, err := amqp.Dial(r.url)
			if err != nil {
				res.err = err
				return
			}
			defer conn.Close()
			closed := conn.NotifyClose(make(chan *amqp.Error, 1))
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				res.err = err
				return
			}
			type inflight struct {
				id string
				dc *amqp.DeferredConfirmation
			}
			var pending []inflight
			settle := func(w inflight) {
				if w.dc.Wait() {
					res.confirmed = append(res.confirmed, w.id)
					confirmedCount.Add(1)
				}
			}
			for seq := 0; ; seq++ {
				id := fmt.Sprintf("p%d-%d", n, seq)
				dc, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, amqp.Publishing{
					Headers: amqp.Table{"x-delay": int32(3600_000)}, MessageId: id, Body: []byte(id)})
				if err != nil {
					break // the connection closed
				}
				pending = append(pending, inflight{id, dc})
				if len(pending) >= window {
					settle(pending[0])
					pending = pending[1:]
				}
			}
			for _, w := range pending {
				settle(w) // false once the connection closed without an ack
			}
			select {
			case res.closeErr = <-closed:
			case <-time.After(15 * time.Second):
				res.err = errors.New("the connection did not report its close")
			}
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for confirmedCount.Load() < 500 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	wg.Wait()
	r.icpt.Wait() // every publish the interceptor took is stored or failed
	stored := r.storedIDs(t, ex)
	r.close(t)

	confirmed := map[string]bool{}
	for n, res := range results {
		if res.err != nil {
			t.Errorf("publisher %d: %v", n, res.err)
		}
		if res.closeErr == nil || res.closeErr.Code != amqp.ConnectionForced {
			t.Errorf("publisher %d: closed with %v, want 320 CONNECTION_FORCED", n, res.closeErr)
		}
		for _, id := range res.confirmed {
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
