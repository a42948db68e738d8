package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// TestRetryBackoffOncePerFailure: when one failure fails many batches in
// flight at once (a closed release channel fails them all), releases pause
// for one backoff, not for one doubling per batch.
func TestRetryBackoffOncePerFailure(t *testing.T) {
	const n = 8
	h := newHarness(t, Options{BatchSize: 1, MaxInFlight: n, RetryBackoffMin: 100 * time.Millisecond, RetryBackoffMax: time.Minute})
	h.rel.confirm = func(_ *store.Message, attempt int) bool { return attempt > 1 }
	block := make(chan struct{})
	h.rel.block = block // every batch is in flight when they fail together
	h.rel.entered = make(chan struct{}, n)
	h.start()
	for i := range n {
		h.put(fmt.Sprint("m", i), 10, 0)
	}
	h.clk.Advance(10 * time.Millisecond)
	h.s.kick()
	for range n {
		<-h.rel.entered
	}
	h.rel.mu.Lock()
	h.rel.block, h.rel.entered = nil, nil
	h.rel.mu.Unlock()
	close(block)
	h.settle()
	h.wantReleased()
	h.advance(99 * time.Millisecond)
	h.wantReleased()
	h.advance(time.Millisecond) // one backoff of 100 ms, whatever the number of batches
	if got := h.rel.released(); len(got) != n {
		t.Fatalf("released %v 100 ms after the failure, want all %d", got, n)
	}
	if got := len(h.rel.batchIDs()); got != 2*n {
		t.Fatalf("%d batches, want %d: each message once failed, once confirmed", got, 2*n)
	}
}
