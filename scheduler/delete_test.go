package scheduler

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// failingDeletes is the real store whose first Delete calls fail, as on a
// full disk.
type failingDeletes struct {
	*boltstore.Store
	mu    sync.Mutex // guards fails
	fails int        // Delete calls still to fail
}

var errDiskFull = errors.New("test: no space left on device")

func (f *failingDeletes) Delete(ctx context.Context, keys ...store.Key) error {
	f.mu.Lock()
	fail := f.fails > 0
	if fail {
		f.fails--
	}
	f.mu.Unlock()
	if fail {
		return errDiskFull
	}
	return f.Store.Delete(ctx, keys...)
}

func TestFailedDeleteIsRetried(t *testing.T) {
	h := newHarness(t, Options{RetryBackoffMin: 100 * time.Millisecond, RetryBackoffMax: 400 * time.Millisecond})
	fd := &failingDeletes{Store: h.st, fails: 3}
	h.backend = fd
	msgs := []*store.Message{h.put("a", 0, 0), h.put("b", 0, 0)}
	h.start()
	h.settle()
	h.wantReleased("a", "b")
	if got := h.stored(msgs...); !got[0] || !got[1] {
		t.Fatalf("stored = %v: the failed deletes cannot have happened", got)
	}
	// Each retry waits for its backoff on the fake clock: 100, 200, 400 ms.
	for range 4 {
		h.advance(400 * time.Millisecond)
	}
	if got := h.stored(msgs...); got[0] || got[1] {
		t.Fatalf("stored = %v after the disk recovered: released messages never deleted", got)
	}
	if n := len(h.rel.released()); n != 2 {
		t.Fatalf("released %d times, want 2 (no release again while deletes fail)", n)
	}
}

func TestDeleteLinger(t *testing.T) {
	tests := []struct {
		name        string
		opts        Options
		storedAfter bool // still stored right after their release
	}{
		{"deletes wait for the linger", Options{DeleteLinger: 50 * time.Millisecond}, true},
		{"MaxInFlight waiting start the delete at once", Options{DeleteLinger: time.Hour, BatchSize: 2, MaxInFlight: 2}, false},
		{"no linger", Options{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.opts)
			msgs := []*store.Message{h.put("a", 0, 0), h.put("b", 0, 0)}
			h.start()
			h.settle()
			h.wantReleased("a", "b")
			if got := h.stored(msgs...); got[0] != tt.storedAfter || got[1] != tt.storedAfter {
				t.Fatalf("stored right after release = %v, want both %v", got, tt.storedAfter)
			}
			h.advance(50 * time.Millisecond)
			if got := h.stored(msgs...); got[0] || got[1] {
				t.Fatalf("stored = %v after the linger: released messages never deleted", got)
			}
			if n := len(h.rel.released()); n != 2 {
				t.Fatalf("released %d times, want 2", n)
			}
		})
	}
}
