// Package storetest is the conformance suite of the store contract: table
// tests of store.Store through the interface alone, which every
// implementation must pass. An implementation's own tests run it:
//
//	func TestContract(t *testing.T) { storetest.Run(t, backend) }
//
// The suite takes due times as given (around 2027, off the wall clock) and
// asks nothing of an implementation beyond the interface, except that when
// the store also has a Check() error method (an integrity check), the suite
// calls it after the steps that change the store.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// Backend makes a new, empty store for one test and returns how to open
// it: the first call opens the empty store, a call after Close opens the
// same store again, holding everything made durable before. The backend
// closes (and may check) what is left open when the test ends.
type Backend func(t *testing.T) (open func() store.Store)

// Run runs the whole suite against stores made by backend, one subtest per
// property of the contract.
func Run(t *testing.T, backend Backend) {
	for _, tc := range []struct {
		name string
		test func(*testing.T, *harness)
	}{
		{"ReleaseOrder", testReleaseOrder},
		{"ScanKeysRanges", testScanKeysRanges},
		{"ScanKeysInChunks", testScanKeysInChunks},
		{"ReopenKeepsEverything", testReopenKeepsEverything},
		{"GetAfterDelete", testGetAfterDelete},
		{"PutRefusals", testPutRefusals},
		{"ClosedStore", testClosedStore},
		{"CloseFinishesAcceptedPuts", testCloseFinishesAcceptedPuts},
		{"CancelByID", testCancelByID},
		{"CancelByKey", testCancelByKey},
		{"ExchangeIncarnations", testExchangeIncarnations},
		{"NextDue", testNextDue},
		{"ListAndCounts", testListAndCounts},
		{"Upcoming", testUpcoming},
		{"ConcurrentUse", testConcurrentUse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := backend(t)
			tc.test(t, &harness{t: t, open: open, s: open()})
		})
	}
}

const (
	base   = Base
	minute = int64(60_000)
	hour   = 60 * minute
)

// harness is the store under test with the suite's helpers.
type harness struct {
	t    *testing.T
	open func() store.Store
	s    store.Store
}

// reopen closes the store and opens it again.
func (h *harness) reopen() {
	h.t.Helper()
	if err := h.s.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	h.s = h.open()
}

// check runs the implementation's integrity check, when it has one.
func (h *harness) check() {
	h.t.Helper()
	if c, ok := h.s.(interface{ Check() error }); ok {
		if err := c.Check(); err != nil {
			h.t.Fatalf("Check: %v", err)
		}
	}
}

func (h *harness) exchange(vhost, name string) store.ExchangeDef {
	h.t.Helper()
	return Exchange(h.t, h.s, vhost, name)
}

func (h *harness) put(msgs ...*store.Message) {
	h.t.Helper()
	Put(h.t, h.s, msgs...)
}

func (h *harness) keys(from, until int64) []store.Key {
	h.t.Helper()
	return Keys(h.t, h.s, from, until)
}

func (h *harness) bodies(keys []store.Key) []string {
	h.t.Helper()
	return Bodies(h.t, h.s, keys)
}

// del deletes keys.
func (h *harness) del(keys ...store.Key) {
	h.t.Helper()
	if err := h.s.Delete(context.Background(), keys...); err != nil {
		h.t.Fatalf("Delete: %v", err)
	}
}

// stale is the number of stored stale messages: what Upcoming counts beyond
// Pending.
func (h *harness) stale() int64 {
	var n int64
	for _, c := range h.s.Upcoming(nil) {
		n += c
	}
	return n - h.s.Pending()
}

// msg is Message.
func msg(exchange string, due int64, prio uint8, body string) *store.Message {
	return Message(exchange, due, prio, body)
}

// seq is the bodies "from" .. "to-1".
func seq(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprint(i))
	}
	return out
}

// keysOf lists the keys of msgs.
func keysOf(msgs []*store.Message) []store.Key {
	out := make([]store.Key, len(msgs))
	for i, m := range msgs {
		out[i] = m.Key
	}
	return out
}

// wantErr fails the test unless err matches want (nil: no error).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if (want == nil && err != nil) || !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}
