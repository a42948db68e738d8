package releaser

import (
	"bytes"
	"context"
	"testing"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/store"
)

// TestReleaseDeliveryTimeKeepsProperties: a delivery-time message (Delay
// 0) is released with the client's properties byte for byte, its
// delivery-time headers included; no x-delay is added.
func TestReleaseDeliveryTimeKeepsProperties(t *testing.T) {
	f := newFixture(t, "direct")
	r := newReleaser(t, Config{})
	for _, props := range [][]byte{
		properties(headers(entry("x-opt-delivery-time", 'l', be64(1_800_000_000_000)), entry("a", 'I', be32(-1))), priority(3)),
		properties(contentType("text/plain"), headers(entry("x-opt-delivery-delay", 'i', be32(1500)), entry("x-opt-delivery-time", 'S', longstr("x")))),
	} {
		if got := r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 0, props, "dt")}); !got[0] {
			t.Fatal("not confirmed")
		}
		if got, body := getRaw(t, f.queue); !bytes.Equal(got, props) || string(body) != "dt" {
			t.Fatalf("released properties\n got %x\nwant %x", got, props)
		}
	}
}

// TestReleaseDropsDeliveryTimeToMissingExchange: an exchange of
// delivery-time messages that RabbitMQ no longer has is never declared;
// its message is held back while passive checks find it missing, dropped
// (reported confirmed, counted unroutable) at the MissingChecks-th, and a
// later message of it at its first check; messages of other exchanges in
// the same batches go out; once the exchange exists again, its messages do.
func TestReleaseDropsDeliveryTimeToMissingExchange(t *testing.T) {
	f := newFixture(t, "direct")
	gone := store.ExchangeDef{VHost: "/", Name: f.exchange + "-gone", Kind: store.KindDeliveryTime}
	var counts counts
	r := newReleaser(t, Config{Registry: registry{gone}, Metrics: &counts})
	props := properties(headers(entry("x-opt-delivery-time", 'l', be64(1))))
	first := message(gone.Name, "k", 0, props, "first")
	ok := message(f.exchange, "k", 0, props, "ok")
	for attempt := 1; attempt <= MissingChecks+1; attempt++ {
		got := r.Release(context.Background(), []*store.Message{first, ok})
		if want := attempt == MissingChecks+1; got[0] != want {
			t.Fatalf("attempt %d: confirmed %v, want %v", attempt, got[0], want)
		}
		if attempt > 1 && !got[1] {
			t.Fatalf("attempt %d: the message of an existing exchange was not released", attempt)
		}
	}
	probe := testbroker.Channel(t, testbroker.Dial(t, f.url))
	if err := probe.ExchangeDeclarePassive(gone.Name, "direct", false, false, false, false, nil); err == nil {
		t.Fatal("the proxy declared an exchange of delivery-time messages")
	}
	later := message(gone.Name, "k", 0, props, "later")
	if got := r.Release(context.Background(), []*store.Message{later}); !got[0] {
		t.Fatal("a later message of a dropped exchange was not dropped at its first check")
	}
	if n := counts.unroutable.Load(); n != 2 {
		t.Fatalf("unroutable = %d, want 2", n)
	}
	// Declared again by its users: released again.
	if err := f.ch.ExchangeDeclare(gone.Name, "direct", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.ch.ExchangeDelete(gone.Name, false, false) })
	if err := f.ch.QueueBind(f.queue, "k", gone.Name, false, nil); err != nil {
		t.Fatal(err)
	}
	back := message(gone.Name, "k", 0, props, "back")
	if got := r.Release(context.Background(), []*store.Message{back}); !got[0] {
		t.Fatal("release to the re-declared exchange not confirmed")
	}
	for _, want := range []string{"ok", "ok", "ok", "back"} {
		if d := f.get(t); string(d.Body) != want {
			t.Fatalf("got %q, want %q", d.Body, want)
		}
	}
}
