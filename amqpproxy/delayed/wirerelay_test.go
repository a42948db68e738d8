package delayed_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/testserver"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// nopScheduler is the Scheduler of a proxy that never releases: these
// tests look at what was stored.
type nopScheduler struct{ st store.Store }

func (nopScheduler) Added(...*store.Message) {}

// DeleteExchange deletes straight from the store: nothing is in flight.
func (s nopScheduler) DeleteExchange(ctx context.Context, vhost, name string) error {
	_, err := s.st.DeleteExchange(ctx, vhost, name)
	return err
}

// wireRelay is an amqpproxy.Server with the delayed-exchange interceptor
// over a real store, in front of one broker.
type wireRelay struct {
	srv  *amqpproxy.Server
	icpt *delayed.Interceptor
	st   *boltstore.Store
	addr string // the proxy's host:port
	b    testbroker.Broker
}

// storeWrapper stands between the interceptor and the relay's store: each
// Put is queued to the store, and its answer goes through wait, the
// test's.
type storeWrapper struct {
	delayed.Store
	wait func(msgs []*store.Message, answer func() error) error
	// beforePutExchange, when set, runs before each registry write.
	beforePutExchange func()
}

func (w *storeWrapper) PutExchange(ctx context.Context, def *store.ExchangeDef) error {
	if w.beforePutExchange != nil {
		w.beforePutExchange()
	}
	return w.Store.PutExchange(ctx, def)
}

// confirmChannel dials the relay as guest and opens a channel in confirm
// mode; the connection is closed when the test ends.
func (r *wireRelay) confirmChannel(t testing.TB) (*amqp.Channel, error) {
	conn, err := amqp.Dial(r.url("guest", "guest"))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	return ch, err
}

func (w *storeWrapper) PutAsync(ctx context.Context, msgs ...*store.Message) func() error {
	answer := w.Store.PutAsync(ctx, msgs...)
	return func() error { return w.wait(msgs, answer) }
}

// startWireRelay starts a relay in front of b with the given settings (the
// store, scheduler, logger and upstream are filled in; a *storeWrapper as
// dcfg.Store wraps the store). When the test ends
// the server is closed (Serve must return ErrServerClosed), then the
// interceptor, then the store is checked.
func startWireRelay(t *testing.T, b testbroker.Broker, dcfg delayed.Config, pcfg amqpproxy.Config) *wireRelay {
	t.Helper()
	st := teststore.Open(t, "", boltstore.Options{})
	log := testlog.New()
	dcfg.Scheduler, dcfg.Logger = nopScheduler{st}, log
	if dcfg.Store == nil {
		dcfg.Store = st
	} else if w, ok := dcfg.Store.(*storeWrapper); ok {
		w.Store = st // the test's wrapper around this store
	}
	icpt := delayed.New(dcfg)
	t.Cleanup(icpt.Close)
	pcfg.Upstream, pcfg.Interceptor, pcfg.Logger = b.URL, icpt, log
	srv, err := amqpproxy.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	return &wireRelay{srv: srv, icpt: icpt, st: st, addr: testserver.Serve(t, srv, amqpproxy.ErrServerClosed), b: b}
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
	testbroker.WithChannel(t, r.url("guest", "guest"), func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(name, delayed.TypeDelayed, false, false, false, false, amqp.Table{"x-delayed-type": "direct"}); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(name, "k", name, false, nil)
	})
	t.Cleanup(func() { r.b.DeleteExchange(t, name) })
	t.Cleanup(func() { r.b.DeleteQueue(t, name) })
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

// storedIDs lists the message-ids stored for exchange in "/".
func (r *wireRelay) storedIDs(t *testing.T, exchange string) map[string]bool {
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
