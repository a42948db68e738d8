package boltstore

import (
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// TestContract runs the conformance suite with the default layout and with
// narrow slots and far buckets, so that its cases cross many slots, far
// buckets and cascade passes.
func TestContract(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"default layout", Options{NoSync: true}},
		{"hour-wide far buckets", Options{NoSync: true, FarWidth: time.Hour}},
		{"narrow", Options{NoSync: true, SlotWidth: 10 * time.Millisecond, FarWidth: time.Second, CascadeLead: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) func() store.Store {
				var h *harness
				return func() store.Store {
					if h == nil {
						h = newHarness(t, tc.opts) // checks the store at cleanup
					} else {
						h.s = h.open()
					}
					return h.s
				}
			})
		})
	}
}
