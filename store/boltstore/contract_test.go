package boltstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// TestContract runs the conformance suite with the default layout and with
// narrower slots and far buckets, so that its cases cross many slots, far
// buckets and cascade passes.
func TestContract(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts boltstore.Options
	}{
		{"default layout", boltstore.Options{NoSync: true}},
		{"hour-wide far buckets", boltstore.Options{NoSync: true, FarWidth: time.Hour}},
		{"narrow", boltstore.Options{NoSync: true, SlotWidth: 10 * time.Millisecond, FarWidth: time.Second, CascadeLead: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) func() store.Store {
				path := filepath.Join(t.TempDir(), "delayproxy.db")
				return func() store.Store { return teststore.Open(t, path, tc.opts) }
			})
		})
	}
}
