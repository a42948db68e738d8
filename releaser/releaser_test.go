package releaser

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

func message(t *testing.T, exchange, key string, delay int64, p wire.Properties, body string) *store.Message {
	t.Helper()
	return &store.Message{
		VHost: "/", Exchange: exchange, RoutingKey: key,
		Properties: p.Append(nil), Body: []byte(body),
		Delay: delay, Due: time.Now().UnixMilli(), Priority: p.Priority,
	}
}

func newReleaser(t *testing.T, cfg Config) *Releaser {
	t.Helper()
	cfg.URL = testbroker.URL(t)
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
	headers, err := wire.EncodeTable(map[string]any{"x-delay": int32(1500), "app": "yes", "n": int64(7)})
	if err != nil {
		t.Fatal(err)
	}
	p := wire.Properties{
		Flags:       wire.FlagContentType | wire.FlagHeaders | wire.FlagDeliveryMode | wire.FlagPriority | wire.FlagMessageID | wire.FlagTimestamp | wire.FlagAppID,
		ContentType: "text/plain", Headers: headers, DeliveryMode: 2, Priority: 3,
		MessageID: "m-1", Timestamp: 1700000000, AppID: "tests",
	}
	got := r.Release(context.Background(), []*store.Message{message(t, f.exchange, "k", 1500, p, "hello")})
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
	var unroutable atomic.Int64
	r := newReleaser(t, Config{OnUnroutable: func(vhost, exchange, key string) { unroutable.Add(1) }})
	var batch []*store.Message
	for i := range 20 {
		key := "k"
		if i%5 == 4 {
			key = "nobody-binds-this"
		}
		p := wire.Properties{Flags: wire.FlagMessageID, MessageID: fmt.Sprint(i)}
		batch = append(batch, message(t, f.exchange, key, 10, p, fmt.Sprint(i)))
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
	for unroutable.Load() != 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := unroutable.Load(); n != 4 {
		t.Fatalf("unroutable = %d, want 4", n)
	}
}

func TestReleaseDeclaresMissingExchangeFromRegistry(t *testing.T) {
	f := newFixture(t, "topic")
	def := store.ExchangeDef{VHost: "/", Name: f.exchange + "-gone", DelayedType: "topic"}
	def.Arguments, _ = wire.EncodeTable(map[string]any{"x-delayed-type": "topic"})
	r := newReleaser(t, Config{Lookup: func(vhost, name string) (store.ExchangeDef, bool) {
		return def, vhost == def.VHost && name == def.Name
	}})
	m := message(t, def.Name, "k", 5, wire.Properties{}, "late")
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
	var reconnects atomic.Int64
	r := newReleaser(t, Config{Name: name, OnReconnect: func(string) { reconnects.Add(1) }})
	r.Warm(context.Background(), "/")
	deadline := time.Now().Add(10 * time.Second)
	for testbroker.CloseConnections(t, name) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("warm-up never dialled the vhost")
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := message(t, f.exchange, "k", 10, wire.Properties{}, "after-close")
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
	if n := reconnects.Load(); n != 1 {
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
			batch = append(batch, message(t, f.exchange, "k", 10, wire.Properties{}, fmt.Sprint(b*10+i)))
		}
		waits = append(waits, r.Publish(context.Background(), batch)) // no wait in between
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
	first := r.Publish(context.Background(), []*store.Message{m}) // the dial fails: 530
	second := r.Publish(context.Background(), []*store.Message{m})
	if first()[0] || second()[0] {
		t.Fatal("confirmed on a vhost that does not exist")
	}
	r.mu.Lock()
	dials := r.dials
	r.mu.Unlock()
	if dials != 1 {
		t.Fatalf("%d dials: the batch right after a failed one was tried instead of refused", dials)
	}
	time.Sleep(failFast)
	r.Publish(context.Background(), []*store.Message{m})()
	r.mu.Lock()
	dials = r.dials
	r.mu.Unlock()
	if dials != 2 {
		t.Fatalf("%d dials: the retry after the fail-fast window was not tried", dials)
	}
}
