// Package teststore opens the stores tests run against: a real bbolt store
// (Open) or a real PostgreSQL store in a schema of its own (PGSchema, OpenPG),
// checked for integrity when the test ends.
package teststore

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// Open opens the bbolt store at path ("": a new file in t.TempDir()) with
// opts. When the test ends it runs the store's Check, failing the test on a
// corrupt store, and closes it; a store the test closed itself is opened
// again for the check. Stores opened at the same path later are checked
// first (cleanups run last in, first out), so the reopening finds the file
// free.
func Open(t testing.TB, path string, opts boltstore.Options) *boltstore.Store {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "delayproxy.db")
	}
	return openChecked(t, func() (*boltstore.Store, error) { return boltstore.Open(path, opts) })
}

// checkedStore is a store with an integrity check.
type checkedStore interface {
	Check() error
	Close() error
}

// openChecked opens a store with open and, when the test ends, runs its
// Check, failing the test on a corrupt store, and closes it; a store the
// test closed itself is opened again for the check.
func openChecked[S checkedStore](t testing.TB, open func() (S, error)) S {
	t.Helper()
	s, err := open()
	if err != nil {
		t.Fatalf("teststore: %v", err)
	}
	t.Cleanup(func() {
		s := s
		err := s.Check()
		if errors.Is(err, store.ErrClosed) {
			if s, err = open(); err != nil {
				t.Errorf("teststore: reopen for the check: %v", err)
				return
			}
			err = s.Check()
		}
		if err != nil {
			t.Errorf("teststore: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("teststore: close: %v", err)
		}
	})
	return s
}
