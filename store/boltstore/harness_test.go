package boltstore

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/storetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	goleak.VerifyTestMain(m)
}

const base = storetest.Base

// harness is a store in a temp dir. When the test ends it closes the store
// (unless the test did) and checks the file as the next Open finds it.
type harness struct {
	t    *testing.T
	path string
	opts Options
	s    *Store
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "delayproxy.db"), opts: opts}
	h.s = h.open()
	t.Cleanup(func() {
		if !h.s.isClosed() {
			if err := h.s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		h.s = h.open()
		defer h.s.Close()
		h.check()
	})
	return h
}

func (h *harness) open() *Store {
	h.t.Helper()
	s, err := Open(h.path, h.opts)
	if err != nil {
		h.t.Fatalf("Open: %v", err)
	}
	return s
}

// reopen closes and opens the store again.
func (h *harness) reopen() {
	h.t.Helper()
	if err := h.s.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	h.s = h.open()
}

func (h *harness) exchange(vhost, name string) store.ExchangeDef {
	h.t.Helper()
	return storetest.Exchange(h.t, h.s, vhost, name)
}

func (h *harness) put(msgs ...*store.Message) {
	h.t.Helper()
	storetest.Put(h.t, h.s, msgs...)
}

func (h *harness) check() {
	h.t.Helper()
	if err := h.s.Check(); err != nil {
		h.t.Fatalf("Check: %v", err)
	}
}

func (h *harness) keys(from, until int64) []store.Key {
	h.t.Helper()
	return storetest.Keys(h.t, h.s, from, until)
}

var msg = storetest.Message

func bodies(t *testing.T, s *Store, keys []store.Key) []string {
	t.Helper()
	return storetest.Bodies(t, s, keys)
}
