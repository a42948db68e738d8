package delayed_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// TestShutdownConfirmsEveryStoredPublish: pipelined confirm-mode publishers
// on a delayed exchange, Server.Shutdown mid-stream: every publish the
// proxy stored was confirmed to its client before 320 CONNECTION_FORCED,
// and everything confirmed was stored.
func TestShutdownConfirmsEveryStoredPublish(t *testing.T) {
	t.Parallel()
	r := startWireRelay(t, testbroker.Default(t), delayed.Config{}, amqpproxy.Config{})
	ex, _ := r.declare(t)
	u := r.url("guest", "guest")

	const publishers = 4
	pubs := crashtest.StartPublishers(publishers, func(n int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name:     fmt.Sprintf("dp-delayed shutdown %d", n),
			URL:      func() string { return u },
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
