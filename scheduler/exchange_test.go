package scheduler

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

func (c *counts) discardedSoFar() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.discarded
}

// TestDeleteExchangeCountsOnlyPending: DeleteExchange discards, and
// counts, the exchange's messages that were still pending: not the
// releases RabbitMQ confirmed whose store delete is lingering, not the
// releases in flight that it confirms after the call; a release in flight
// that is not confirmed is discarded, counted once, and never released
// again.
func TestDeleteExchangeCountsOnlyPending(t *testing.T) {
	m := &counts{}
	h := newHarness(t, Options{Metrics: m, DeleteLinger: time.Hour, RetryBackoffMin: 100 * time.Millisecond})
	h.rel.confirm = func(msg *store.Message, _ int) bool { return msg.MessageID != "refused" }
	h.start()
	lingering := []*store.Message{h.put("l1", 10, 0), h.put("l2", 10, 0), h.put("l3", 10, 0)}
	h.advance(10 * time.Millisecond)
	h.wantReleased("l1", "l2", "l3")
	if got := h.stored(lingering...); !slices.Equal(got, []bool{true, true, true}) {
		t.Fatalf("confirmed releases stored %v, want all still there (the linger)", got)
	}

	// Two releases in flight when the exchange goes: RabbitMQ confirms one.
	inflight := []*store.Message{h.put("confirmed", 20, 0), h.put("refused", 20, 0)}
	pending := []*store.Message{h.put("p1", 1000, 0), h.put("p2", 1000, 0)}
	block := make(chan struct{})
	h.rel.mu.Lock()
	h.rel.block, h.rel.entered = block, make(chan struct{}, 1)
	entered := h.rel.entered
	h.rel.mu.Unlock()
	h.clk.Advance(10 * time.Millisecond)
	h.s.kick()
	<-entered

	if err := h.s.DeleteExchange(context.Background(), "/", "dx"); err != nil {
		t.Fatalf("DeleteExchange: %v", err)
	}
	if _, ok := h.st.Exchange("/", "dx"); ok {
		t.Fatal("the exchange is still registered after DeleteExchange returned")
	}
	if got := h.stored(lingering...); slices.Contains(got, true) {
		t.Fatalf("confirmed releases stored %v after DeleteExchange, want all deleted first", got)
	}
	if n := m.discardedSoFar(); n != 0 {
		t.Fatalf("discarded %d while releases were in flight, want the count after their answer", n)
	}
	h.rel.mu.Lock()
	h.rel.block, h.rel.entered = nil, nil
	h.rel.mu.Unlock()
	close(block)
	h.settle()
	h.wantReleased("l1", "l2", "l3", "confirmed")
	if n := m.discardedSoFar(); n != 3 {
		t.Fatalf("discarded %d, want 3: refused, p1, p2", n)
	}
	h.advance(2 * time.Second) // past the retry and the pending ones' due time
	h.wantReleased("l1", "l2", "l3", "confirmed")
	h.advance(time.Hour) // the linger of their deletes
	if got := h.stored(append(inflight, pending...)...); slices.Contains(got, true) {
		t.Fatalf("store holds %v of [confirmed refused p1 p2], want none", got)
	}
	if n := m.discardedSoFar(); n != 3 {
		t.Fatalf("discarded %d at the end, want 3", n)
	}
}

// TestDeleteExchangeWithoutRun: before Run has taken it the call waits;
// after Run returned it goes straight to the store; an exchange not
// registered is the store's ErrUnknownExchange.
func TestDeleteExchangeWithoutRun(t *testing.T) {
	m := &counts{}
	h := newHarness(t, Options{Metrics: m})
	h.start()
	h.put("a", 10, 0)
	h.settle()
	if err := h.s.DeleteExchange(context.Background(), "/", "nope"); !errors.Is(err, store.ErrUnknownExchange) {
		t.Fatalf("DeleteExchange of an exchange not registered = %v, want ErrUnknownExchange", err)
	}
	h.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.s.DeleteExchange(ctx, "/", "dx"); err != nil {
		t.Fatalf("DeleteExchange after Run returned: %v", err)
	}
	if n := m.discardedSoFar(); n != 1 {
		t.Fatalf("discarded %d, want 1", n)
	}

	h2 := newHarness(t, Options{})
	h2.s = New(h2.st, h2.rel, Options{})
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h2.s.DeleteExchange(ctx, "/", "dx"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeleteExchange before Run = %v, want it to wait for Run (here: the context)", err)
	}
}
