package scheduler

import (
	"sync"
	"sync/atomic"

	"github.com/delayproxy/delayproxy/store"
)

// withdrawnKeys are keys cancelled (Cancelled) after their batch was
// dispatched, so that publishLoop leaves them out if they have not been
// published yet. Only ReadAhead makes that gap longer than a hand-off.
// The loop adds and forgets keys; publishLoop takes them.
type withdrawnKeys struct {
	n    atomic.Int64 // len(keys), read without the lock on every publish
	mu   sync.Mutex   // guards keys
	keys map[store.Key]struct{}
}

// add withdraws k.
func (w *withdrawnKeys) add(k store.Key) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = make(map[store.Key]struct{})
	}
	if _, ok := w.keys[k]; !ok {
		w.keys[k] = struct{}{}
		w.n.Add(1)
	}
}

// take reports whether k was withdrawn, and forgets it.
func (w *withdrawnKeys) take(k store.Key) bool {
	if w.n.Load() == 0 {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.keys[k]
	if ok {
		delete(w.keys, k)
		w.n.Add(-1)
	}
	return ok
}

// forget drops keys whose release is over: a withdrawal that came after
// the publish.
func (w *withdrawnKeys) forget(keys []store.Key) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range keys {
		if _, ok := w.keys[k]; ok {
			delete(w.keys, k)
			w.n.Add(-1)
		}
	}
}
