package releaser

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// TestReleaseBodiesAcrossFrames: bodies are split to RabbitMQ's
// negotiated frame_max, whether copied into the batch or written from the
// message, and arrive whole and in order.
func TestReleaseBodiesAcrossFrames(t *testing.T) {
	f := newFixture(t, "direct")
	r := newReleaser(t, Config{})
	if err := r.Ping(context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	frameMax := r.conns["/"].frameMax
	r.mu.Unlock()
	if frameMax != 131072 {
		t.Fatalf("frame_max %d, want RabbitMQ's default 131072", frameMax)
	}
	payload := frameMax - wire.FrameOverhead
	sizes := []int{0, 1, inlineBody, inlineBody + 1, payload, payload + 1, 3*payload + 5, 1<<20 + 3}
	var batch []*store.Message
	for i, n := range sizes {
		body := bytes.Repeat([]byte{byte('a' + i)}, n)
		batch = append(batch, message(f.exchange, "k", 10, properties(messageID(fmt.Sprint(n))), string(body)))
	}
	for i, ok := range r.Release(context.Background(), batch) {
		if !ok {
			t.Fatalf("release of %d bytes not confirmed", sizes[i])
		}
	}
	for i, n := range sizes {
		d := f.get(t)
		if d.MessageId != fmt.Sprint(n) || !bytes.Equal(d.Body, batch[i].Body) {
			t.Fatalf("release %d: message %q with %d body bytes, want %d bytes of %q", i, d.MessageId, len(d.Body), n, rune('a'+i))
		}
	}
}

// TestReleaseDiscardsWhatCannotBeReleased: a stored record that cannot be
// released (properties that do not parse, a content header larger than
// frame_max) is reported confirmed, so it leaves the store, and sent
// nowhere; the rest of the batch goes out.
func TestReleaseDiscardsWhatCannotBeReleased(t *testing.T) {
	f := newFixture(t, "direct")
	r := newReleaser(t, Config{})
	huge := properties(headers(entry("big", 'S', longstr(strings.Repeat("h", 140_000)))))
	batch := []*store.Message{
		message(f.exchange, "k", 10, []byte{0x80, 0x00, 9}, "truncated content-type"),
		message(f.exchange, "k", 10, huge, "header over frame_max"),
		message(f.exchange, strings.Repeat("k", 256), 10, properties(), "routing key too long"),
		message(f.exchange, "k", 10, properties(messageID("ok")), "fine"),
	}
	for i, ok := range r.Release(context.Background(), batch) {
		if !ok {
			t.Fatalf("message %d not reported confirmed", i)
		}
	}
	if d := f.get(t); d.MessageId != "ok" {
		t.Fatalf("got %q (%q)", d.MessageId, d.Body)
	}
	if d, ok, err := f.ch.Get(f.queue, true); ok || err != nil {
		t.Fatalf("more arrived: %q, %v", d.Body, err)
	}
}

// TestEncoderReusesItsBuffers: encoding a release allocates nothing once
// the buffers have grown.
func TestEncoderReusesItsBuffers(t *testing.T) {
	m := message("orders.delayed", "order.created.eu", 1500, properties(contentType("application/json"),
		headers(entry("x-delay", 'I', be32(1500)), entry("trace-id", 'S', longstr("4bf92f3577b34da6"))),
		deliveryMode(2), messageID("order-12345")), strings.Repeat("b", 512))
	var e encoder
	for _, dt := range []DelayType{DelayInt64, DelayInt32} {
		add := func() {
			e.reset()
			for range 16 {
				if err := e.add(m, 131072, dt); err != nil {
					t.Fatal(err)
				}
			}
		}
		add()
		if n := testing.AllocsPerRun(100, add); n != 0 {
			t.Errorf("%s: %v allocations per batch of 16", dt, n)
		}
	}
}
