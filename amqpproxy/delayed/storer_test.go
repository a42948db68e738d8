package delayed_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/intake"
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
	ch, err := r.confirmChannel(t)
	if err != nil {
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

// TestStorerKeepsToTheIntakeWindow: with the intake gate's window cut to
// intake.MinWindow (a release was late), two connections publishing 300
// delayed messages each, 300 unconfirmed, never have more than the window
// in Puts at once, and every message is stored and confirmed.
func TestStorerKeepsToTheIntakeWindow(t *testing.T) {
	t.Parallel()
	const conns, perConn = 2, 300
	gate := intake.New(time.Millisecond, nil)
	if _, err := gate.Acquire(context.Background(), 2*intake.MinWindow); err != nil {
		t.Fatal(err)
	}
	gate.Observe(time.Second) // window: MinWindow
	gate.Release(2 * intake.MinWindow)
	// Releases keep coming on time meanwhile (the window stays shut, but
	// for the one message a window's worth of them adds), so it does not
	// open for lack of them.
	stop := make(chan struct{})
	var ticks sync.WaitGroup
	ticks.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				gate.Observe(0)
			}
		}
	})
	defer func() { close(stop); ticks.Wait() }()

	var mu sync.Mutex // guards inPuts, most
	inPuts, most := 0, 0
	w := &storeWrapper{wait: func(msgs []*store.Message, answer func() error) error {
		mu.Lock()
		inPuts += len(msgs)
		most = max(most, inPuts)
		mu.Unlock()
		time.Sleep(time.Millisecond) // a commit's time, so Puts overlap
		err := answer()
		mu.Lock()
		inPuts -= len(msgs)
		mu.Unlock()
		return err
	}}
	r := startWireRelay(t, testbroker.Default(t), delayed.Config{Store: w, Intake: gate}, amqpproxy.Config{})
	ex, _ := r.declare(t)
	var pubs sync.WaitGroup
	for c := range conns {
		pubs.Go(func() {
			ch, err := r.confirmChannel(t)
			if err != nil {
				t.Error(err)
				return
			}
			var dcs []*amqp.DeferredConfirmation
			for i := range perConn {
				dc, err := ch.PublishWithDeferredConfirm(ex, "k", false, false, amqp.Publishing{
					MessageId: fmt.Sprintf("%d-%d", c, i), Headers: amqp.Table{"x-delay": int64(time.Hour / time.Millisecond)}})
				if err != nil {
					t.Error(err)
					return
				}
				dcs = append(dcs, dc)
			}
			for _, dc := range dcs {
				if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
					t.Errorf("publish not acked: %v, %v", ok, err)
					return
				}
			}
		})
	}
	pubs.Wait()
	if n := r.stored(t, ex); n != conns*perConn {
		t.Fatalf("%d stored, want %d", n, conns*perConn)
	}
	mu.Lock()
	defer mu.Unlock()
	if most > gate.Window() || most < 2 {
		t.Fatalf("at most %d messages in Puts at once, with a window of %d", most, gate.Window())
	}
	t.Logf("at most %d messages in Puts at once, window %d", most, gate.Window())
}
