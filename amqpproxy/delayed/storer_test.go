package delayed_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/store"
)

// TestSecondPutWhileTheFirstCommits: while the Put of a connection's first
// delayed publish waits on the store, the next publish is stored by a
// second Put and confirmed; the first is confirmed once its Put returns.
func TestSecondPutWhileTheFirstCommits(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	w := &storeWrapper{wait: func(msgs []*store.Message, answer func() error) error {
		if msgs[0].MessageID == "first" {
			entered <- struct{}{}
			<-release
		}
		return answer()
	}}
	r := startWireRelay(t, testbroker.Default(t), delayed.Config{Store: w}, amqpproxy.Config{})
	ex, _ := r.declare(t)
	conn, err := amqp.Dial(r.url("guest", "guest"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(id string) *amqp.DeferredConfirmation {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, amqp.Publishing{
			MessageId: id, Headers: amqp.Table{"x-delay": int64(time.Hour / time.Millisecond)}, Body: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		return dc
	}
	first := publish("first")
	<-entered
	second := publish("second")
	select {
	case <-second.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the second publish was not confirmed while the first Put waited")
	}
	if !second.Acked() {
		t.Fatal("the second publish was nacked")
	}
	select {
	case <-first.Done():
		t.Fatal("the first publish was confirmed before its Put returned")
	default:
	}
	close(release)
	if ok, err := first.WaitContext(context.Background()); err != nil || !ok {
		t.Fatalf("first: acked %v, %v", ok, err)
	}
	if n := r.stored(t, ex); n != 2 {
		t.Fatalf("%d stored, want 2", n)
	}
}
