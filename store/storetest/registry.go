package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// testCancelByID: Cancel removes the messages of one exchange with exactly
// that message-id and returns their keys.
func testCancelByID(t *testing.T, h *harness) {
	ctx := context.Background()
	h.exchange("/", "x")
	h.exchange("/", "y")
	for i, tc := range []struct {
		name     string
		scanned  bool // a scan passed the due times before the Puts
		id, ex   string
		want     []int // indexes of the x messages cancelled (4: y's)
		countX   int64
		wantLeft []string
	}{
		{name: "duplicate id", id: "dup", ex: "x", want: []int{0, 2}, countX: 2, wantLeft: []string{"1", "3", "y-dup"}},
		{name: "duplicate id, scanned", scanned: true, id: "dup", ex: "x", want: []int{0, 2}, countX: 2, wantLeft: []string{"1", "3", "y-dup"}},
		{name: "unique id", id: "one", ex: "x", want: []int{1}, countX: 3, wantLeft: []string{"0", "2", "3", "y-dup"}},
		{name: "unknown id", id: "nope", ex: "x", countX: 4, wantLeft: []string{"0", "1", "2", "3", "y-dup"}},
		{name: "other exchange", id: "dup", ex: "y", want: []int{4}, countX: 4, wantLeft: []string{"0", "1", "2", "3"}},
		{name: "unknown exchange", id: "dup", ex: "nope", countX: 4, wantLeft: []string{"0", "1", "2", "3", "y-dup"}},
		{name: "an id prefix does not match", id: "du", ex: "x", countX: 4, wantLeft: []string{"0", "1", "2", "3", "y-dup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			day := base + int64(i)*24*hour
			if tc.scanned {
				h.keys(0, day+hour)
			}
			var msgs []*store.Message
			for i, id := range []string{"dup", "one", "dup", ""} {
				m := msg("x", day+int64(i)*1000, 0, fmt.Sprint(i))
				m.MessageID = id
				msgs = append(msgs, m)
			}
			y := msg("y", day, 0, "y-dup")
			y.MessageID = "dup"
			msgs = append(msgs, y)
			h.put(msgs...)
			got, err := h.s.Cancel(ctx, "/", tc.ex, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			var want []store.Key
			for _, i := range tc.want {
				want = append(want, msgs[i].Key)
			}
			slices.SortFunc(got, store.CompareKeys)
			if !slices.Equal(got, want) {
				t.Fatalf("Cancel returned %x, want %x", got, want)
			}
			var left []string
			for _, b := range h.bodies(keysOf(msgs)) {
				if b != "<nil>" {
					left = append(left, b)
				}
			}
			if !slices.Equal(left, tc.wantLeft) {
				t.Fatalf("left %q, want %q", left, tc.wantLeft)
			}
			if got := h.s.Count("/", "x"); got != tc.countX {
				t.Fatalf("Count x = %d, want %d", got, tc.countX)
			}
			h.check()
			h.del(keysOf(msgs)...) // the next case starts empty
		})
	}
}

// testCancelByKey: CancelKey reports whether the message was pending, and a
// cancelled message's id no longer matches.
func testCancelByKey(t *testing.T, h *harness) {
	ctx := context.Background()
	h.exchange("/", "x")
	a, b := msg("x", base, 0, "a"), msg("x", base+1, 0, "b")
	a.MessageID = "ida"
	h.put(a, b)
	for _, step := range []struct {
		key  store.Key
		want bool
	}{{a.Key, true}, {a.Key, false}, {store.MakeKey(base, 0, 12345), false}} {
		ok, err := h.s.CancelKey(ctx, step.key)
		if err != nil || ok != step.want {
			t.Fatalf("CancelKey(%x) = %v, %v; want %v", step.key, ok, err, step.want)
		}
	}
	if got := h.bodies([]store.Key{a.Key, b.Key}); !slices.Equal(got, []string{"<nil>", "b"}) {
		t.Fatalf("after CancelKey: %q", got)
	}
	if keys, err := h.s.Cancel(ctx, "/", "x", "ida"); err != nil || len(keys) != 0 {
		t.Fatalf("Cancel by the id of a cancelled message = %x, %v; want none", keys, err)
	}
	if p := h.s.Pending(); p != 1 {
		t.Fatalf("Pending %d, want 1", p)
	}
	h.check()
}

// testExchangeIncarnations: CancelExchange and DeleteExchange make an
// exchange's messages stale at once; a re-declared exchange keeps its
// incarnation, a re-created one gets a new one and its old messages stay
// stale; counts follow, across a reopen.
func testExchangeIncarnations(t *testing.T, h *harness) {
	ctx := context.Background()
	x1 := h.exchange("/", "x")
	h.exchange("/", "other")
	if again := h.exchange("/", "x"); again.Incarnation != x1.Incarnation {
		t.Fatalf("re-declaring keeps the incarnation: got %d, want %d", again.Incarnation, x1.Incarnation)
	}
	var old []*store.Message
	for i := range 10 {
		m := msg("x", base+int64(i)*hour, 0, fmt.Sprint(i))
		m.MessageID = "id"
		old = append(old, m)
	}
	h.put(old...)
	h.put(msg("other", base, 0, "o"))
	expect := func(when string, pending, stale, countX int64) {
		t.Helper()
		if p, s, c := h.s.Pending(), h.stale(), h.s.Count("/", "x"); p != pending || s != stale || c != countX {
			t.Fatalf("%s: Pending %d, stale %d, Count x %d; want %d, %d, %d", when, p, s, c, pending, stale, countX)
		}
	}
	expect("before cancelling", 11, 0, 10)

	n, err := h.s.CancelExchange(ctx, "/", "x")
	if err != nil || n != 10 {
		t.Fatalf("CancelExchange = %d, %v; want 10", n, err)
	}
	x2, ok := h.s.Exchange("/", "x")
	if !ok || x2.Incarnation == x1.Incarnation {
		t.Fatalf("after CancelExchange: %+v %v, want a new incarnation", x2, ok)
	}
	for _, m := range old {
		if !h.s.Stale(m) {
			t.Fatalf("message %s not stale after CancelExchange", m.Body)
		}
	}
	if got := h.bodies(keysOf(old[:1])); got[0] != "0" {
		t.Fatalf("a stale message is still stored until deleted: Get = %q", got)
	}
	expect("after CancelExchange", 1, 10, 0)
	fresh := msg("x", base+1, 0, "fresh")
	fresh.MessageID = "id"
	h.put(fresh)
	if h.s.Stale(fresh) {
		t.Fatal("a message put after CancelExchange is stale")
	}
	expect("after a fresh put", 2, 10, 1)
	h.check()

	// The scheduler deletes two stale messages: stale count drops, live stays.
	h.del(old[0].Key, old[1].Key)
	expect("after deleting stale messages", 2, 8, 1)
	// Cancel by id removes stale and pending ones with that id, returns the
	// pending one.
	if keys, err := h.s.Cancel(ctx, "/", "x", "id"); err != nil || !slices.Equal(keys, []store.Key{fresh.Key}) {
		t.Fatalf("Cancel = %x, %v; want the fresh message's key", keys, err)
	}
	expect("after Cancel by id", 1, 0, 0)
	h.check()

	// DeleteExchange, then re-create: old messages stay stale.
	m3 := msg("x", base+5, 0, "m3")
	h.put(m3)
	if n, err := h.s.DeleteExchange(ctx, "/", "x"); err != nil || n != 1 {
		t.Fatalf("DeleteExchange = %d, %v; want 1", n, err)
	}
	if _, ok := h.s.Exchange("/", "x"); ok {
		t.Fatal("exchange still registered after DeleteExchange")
	}
	if !h.s.Stale(m3) {
		t.Fatal("message of a deleted exchange is not stale")
	}
	if c := h.s.Count("/", "x"); c != 0 {
		t.Fatalf("Count of a deleted exchange %d, want 0", c)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"DeleteExchange twice", func() error { _, err := h.s.DeleteExchange(ctx, "/", "x"); return err }},
		{"CancelExchange of a deleted exchange", func() error { _, err := h.s.CancelExchange(ctx, "/", "x"); return err }},
		{"List of a deleted exchange", func() error { _, err := h.s.List("/", "x", store.Key{}, 1, false); return err }},
		{"Put with the deleted incarnation", func() error {
			m := msg("x", base, 0, "nope")
			m.Incarnation = x2.Incarnation
			return h.s.Put(ctx, m)
		}},
	} {
		if err := tc.call(); !errors.Is(err, store.ErrUnknownExchange) {
			t.Fatalf("%s: %v, want ErrUnknownExchange", tc.name, err)
		}
	}
	x3 := h.exchange("/", "x")
	if x3.Incarnation == x2.Incarnation || x3.Incarnation == x1.Incarnation {
		t.Fatalf("re-created exchange reuses incarnation %d", x3.Incarnation)
	}
	h.reopen()
	if !h.s.Stale(m3) {
		t.Fatal("after re-create and reopen: the old message is not stale")
	}
	expect("after re-create and reopen", 1, 1, 0)
	if got := h.s.Exchanges(); len(got) != 2 {
		t.Fatalf("Exchanges = %+v, want 2", got)
	}
	h.check()
}
