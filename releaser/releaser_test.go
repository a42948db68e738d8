package releaser

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counts is a Metrics that counts.
type counts struct{ unroutable, reconnects atomic.Int64 }

func (c *counts) Unroutable(n int)   { c.unroutable.Add(int64(n)) }
func (c *counts) UpstreamReconnect() { c.reconnects.Add(1) }

// registry is a Registry of the given delayed exchanges.
type registry []store.ExchangeDef

func (r registry) Exchange(vhost, name string) (store.ExchangeDef, bool) {
	for _, d := range r {
		if d.VHost == vhost && d.Name == name {
			return d, true
		}
	}
	return store.ExchangeDef{}, false
}

// fixture is a real exchange and queue in RabbitMQ, bound with key "k".
type fixture struct {
	url      string
	exchange string
	queue    string
	ch       *amqp.Channel
}

func newFixture(t *testing.T, kind string) *fixture {
	t.Helper()
	url := testbroker.URL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{url: url, exchange: fmt.Sprintf("rel-x-%s-%d", t.Name(), time.Now().UnixNano()), ch: ch}
	f.queue = f.exchange + "-q"
	if err := ch.ExchangeDeclare(f.exchange, kind, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(f.queue, false, false, false, false, amqp.Table{"x-max-priority": int32(10)}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(f.queue, "k", f.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch.QueueDelete(f.queue, false, false, false)
		ch.ExchangeDelete(f.exchange, false, false)
		conn.Close()
	})
	return f
}

// get waits for the next message on the queue.
func (f *fixture) get(t *testing.T) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		d, ok, err := f.ch.Get(f.queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return d
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no message arrived")
	return amqp.Delivery{}
}

// message is a stored release of body to exchange with key, delayed by
// delay ms, with the raw properties props.
func message(exchange, key string, delay int64, props []byte, body string) *store.Message {
	return &store.Message{
		VHost: "/", Exchange: exchange, RoutingKey: key,
		Properties: props, Body: []byte(body),
		Delay: delay, Due: time.Now().UnixMilli(),
	}
}

// newReleaser is New with cfg, on the test broker unless cfg names a URL,
// closed in t.Cleanup.
func newReleaser(t *testing.T, cfg Config) *Releaser {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testbroker.URL(t)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestReleaseKeepsMessageAndSetsNegativeDelay(t *testing.T) {
	f := newFixture(t, "direct")
	r := newReleaser(t, Config{})
	p := properties(
		contentType("text/plain"),
		headers(entry("x-delay", 'I', be32(1500)), entry("app", 'S', longstr("yes")), entry("n", 'l', be64(7))),
		deliveryMode(2), priority(3), messageID("m-1"), timestamp(1700000000), appID("tests"),
	)
	got := r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 1500, p, "hello")})
	if !got[0] {
		t.Fatal("release not confirmed")
	}
	d := f.get(t)
	if string(d.Body) != "hello" || d.ContentType != "text/plain" || d.DeliveryMode != 2 || d.Priority != 3 ||
		d.MessageId != "m-1" || d.AppId != "tests" || d.Timestamp.Unix() != 1700000000 || d.RoutingKey != "k" {
		t.Fatalf("delivery changed: %+v", d)
	}
	if v := d.Headers["x-delay"]; v != int64(-1500) {
		t.Fatalf("x-delay = %#v (%T), want int64(-1500)", v, v)
	}
	if d.Headers["app"] != "yes" || d.Headers["n"] != int64(7) {
		t.Fatalf("headers changed: %v", d.Headers)
	}
}

func TestReleaseOrderAndUnroutable(t *testing.T) {
	f := newFixture(t, "direct")
	var m counts
	r := newReleaser(t, Config{Metrics: &m})
	var batch []*store.Message
	for i := range 20 {
		key := "k"
		if i%5 == 4 {
			key = "nobody-binds-this"
		}
		batch = append(batch, message(f.exchange, key, 10, properties(messageID(fmt.Sprint(i))), fmt.Sprint(i)))
	}
	got := r.Release(context.Background(), batch)
	for i, ok := range got {
		if !ok {
			t.Fatalf("message %d not confirmed", i)
		}
	}
	for i := range 20 {
		if i%5 == 4 {
			continue
		}
		if d := f.get(t); string(d.Body) != fmt.Sprint(i) {
			t.Fatalf("got %q, want %d: order lost", d.Body, i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.unroutable.Load() != 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := m.unroutable.Load(); n != 4 {
		t.Fatalf("unroutable = %d, want 4", n)
	}
}

func TestReleaseDeclaresMissingExchangeFromRegistry(t *testing.T) {
	f := newFixture(t, "topic")
	def := store.ExchangeDef{VHost: "/", Name: f.exchange + "-gone", DelayedType: "topic"}
	// An argument of a type amqp091-go would not write ('s', int16): the
	// declare carries the client's bytes.
	def.Arguments = concat(entry("x-delayed-type", 'S', longstr("topic")), entry("x-custom", 's', []byte{0, 7}))
	r := newReleaser(t, Config{Registry: registry{def}})
	m := message(def.Name, "k", 5, properties(), "late")
	if got := r.Release(context.Background(), []*store.Message{m}); got[0] {
		t.Fatal("release to a missing exchange reported confirmed")
	}
	t.Cleanup(func() { f.ch.ExchangeDelete(def.Name, false, false) })
	// The releaser declared it again; bind it and retry.
	if err := f.ch.QueueBind(f.queue, "#", def.Name, false, nil); err != nil {
		t.Fatalf("exchange was not declared again: %v", err)
	}
	if got := r.Release(context.Background(), []*store.Message{m}); !got[0] {
		t.Fatal("retry not confirmed")
	}
	if d := f.get(t); string(d.Body) != "late" {
		t.Fatalf("got %q", d.Body)
	}
}

func TestReleaseUnreachableReportsUnconfirmed(t *testing.T) {
	r, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/", DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := r.Release(context.Background(), []*store.Message{{VHost: "/", Exchange: "x"}})
	if got[0] {
		t.Fatal("confirmed without a broker")
	}
}

func TestReleaseReconnectsAfterBrokerClosesConnection(t *testing.T) {
	f := newFixture(t, "direct")
	name := fmt.Sprintf("releaser-test-%d", time.Now().UnixNano())
	var counts counts
	r := newReleaser(t, Config{Name: name, Metrics: &counts})
	r.Warm("/")
	deadline := time.Now().Add(10 * time.Second)
	for testbroker.CloseConnections(t, name) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("warm-up never dialled the vhost")
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := message(f.exchange, "k", 10, properties(), "after-close")
	var ok bool
	for attempt := 0; attempt < 3 && !ok; attempt++ {
		ok = r.Release(context.Background(), []*store.Message{m})[0]
	}
	if !ok {
		t.Fatal("release not confirmed after the broker closed the connection")
	}
	if d := f.get(t); string(d.Body) != "after-close" {
		t.Fatalf("got %q", d.Body)
	}
	if n := counts.reconnects.Load(); n != 1 {
		t.Fatalf("reconnects = %d, want 1", n)
	}
}

func TestPublishPipelinesBatchesInOrder(t *testing.T) {
	f := newFixture(t, "direct")
	r := newReleaser(t, Config{})
	var waits []func() []bool
	for b := range 5 {
		var batch []*store.Message
		for i := range 10 {
			batch = append(batch, message(f.exchange, "k", 10, properties(), fmt.Sprint(b*10+i)))
		}
		wait, refused := r.Publish(context.Background(), batch) // no wait in between
		if refused {
			t.Fatalf("batch %d refused", b)
		}
		waits = append(waits, wait)
	}
	for b, w := range waits {
		for i, ok := range w() {
			if !ok {
				t.Fatalf("batch %d message %d not confirmed", b, i)
			}
		}
	}
	for i := range 50 {
		if d := f.get(t); string(d.Body) != fmt.Sprint(i) {
			t.Fatalf("got %q, want %d", d.Body, i)
		}
	}
}

func TestBatchAfterFailedPublishDoesNotOvertakeIt(t *testing.T) {
	r := newReleaser(t, Config{DialTimeout: time.Second})
	m := &store.Message{VHost: "no-such-vhost-" + t.Name(), Exchange: "x"}
	first, firstRefused := r.Publish(context.Background(), []*store.Message{m}) // the dial fails: 530
	second, secondRefused := r.Publish(context.Background(), []*store.Message{m})
	if first()[0] || second()[0] {
		t.Fatal("confirmed on a vhost that does not exist")
	}
	if !firstRefused || !secondRefused {
		t.Fatalf("refused: first %v, second %v; both were written nowhere", firstRefused, secondRefused)
	}
	r.mu.Lock()
	dials := r.dials
	r.mu.Unlock()
	if dials != 1 {
		t.Fatalf("%d dials: the batch right after a failed one was tried instead of refused", dials)
	}
	time.Sleep(failFast)
	r.Release(context.Background(), []*store.Message{m})
	r.mu.Lock()
	dials = r.dials
	r.mu.Unlock()
	if dials != 2 {
		t.Fatalf("%d dials: the retry after the fail-fast window was not tried", dials)
	}
}
