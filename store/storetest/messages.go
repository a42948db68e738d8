package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// testReleaseOrder: ScanKeys returns keys by due time, then higher priority,
// then publish order, whether the messages were put before or after a scan
// reached their due time, and again after a reopen.
func testReleaseOrder(t *testing.T, h *harness) {
	type in struct {
		due  int64
		prio uint8
		body string
	}
	x := h.exchange("/", "x")
	for i, tc := range []struct {
		name   string
		scanAt int64 // ScanKeys(0, base+scanAt) before publishing (0: none)
		async  bool  // every message by PutAsync, then every wait
		msgs   []in
		want   []string
	}{
		{
			name: "due order",
			msgs: []in{{3000, 0, "c"}, {1000, 0, "a"}, {2000, 0, "b"}},
			want: []string{"a", "b", "c"},
		},
		{
			name: "priority breaks due ties, higher first",
			msgs: []in{{1000, 0, "p0"}, {1000, 9, "p9"}, {1000, 255, "p255"}, {1000, 1, "p1"}},
			want: []string{"p255", "p9", "p1", "p0"},
		},
		{
			name: "equal due and priority keep publish order",
			msgs: []in{{1000, 5, "first"}, {1000, 5, "second"}, {1000, 5, "third"}},
			want: []string{"first", "second", "third"},
		},
		{
			name:  "PutAsync calls in flight together keep call order",
			async: true,
			msgs:  []in{{1000, 5, "a1"}, {1000, 5, "a2"}, {1000, 5, "a3"}, {1000, 5, "a4"}, {1000, 5, "a5"}},
			want:  []string{"a1", "a2", "a3", "a4", "a5"},
		},
		{
			name: "due before priority",
			msgs: []in{{1001, 0, "late-low"}, {1000, 0, "early-low"}, {1001, 255, "late-high"}},
			want: []string{"early-low", "late-high", "late-low"},
		},
		{
			name:   "put before and after a scan reached them",
			scanAt: 5000,
			msgs: []in{
				{200_000, 0, "later2"}, {1000, 0, "near1"}, {100_000, 3, "later1-p3"}, {100_000, 3, "later1-p3b"},
				{4 * hour, 0, "later3"}, {1000, 7, "near1-p7"}, {30_000, 0, "near2"}, {100_000, 4, "later1-p4"},
			},
			want: []string{"near1-p7", "near1", "near2", "later1-p4", "later1-p3", "later1-p3b", "later2", "later3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each case has its own day, so that cases do not mix.
			day := base + int64(i)*24*hour
			if tc.scanAt != 0 {
				h.keys(0, day+tc.scanAt)
			}
			var waits []func() error
			for _, m := range tc.msgs {
				if tc.async {
					am := msg("x", day+m.due, m.prio, m.body)
					am.Incarnation = x.Incarnation
					waits = append(waits, h.s.PutAsync(context.Background(), am))
				} else {
					h.put(msg("x", day+m.due, m.prio, m.body))
				}
			}
			for _, wait := range waits {
				if err := wait(); err != nil {
					t.Fatalf("PutAsync: %v", err)
				}
			}
			keys := h.keys(day, day+24*hour)
			if got := h.bodies(keys); !slices.Equal(got, tc.want) {
				t.Fatalf("release order %q, want %q", got, tc.want)
			}
			if !slices.IsSortedFunc(keys, store.CompareKeys) {
				t.Fatalf("keys not sorted: %x", keys)
			}
			h.reopen()
			if got := h.bodies(h.keys(day, day+24*hour)); !slices.Equal(got, tc.want) {
				t.Fatalf("after reopen %q, want %q", got, tc.want)
			}
			h.check()
		})
	}
}

// testScanKeysRanges: [from, until) bounds, empty and reversed ranges,
// ErrStop and other callback errors.
func testScanKeysRanges(t *testing.T, h *harness) {
	h.exchange("/", "x")
	// Messages at 0.5 s steps from base.
	for i := range 20 {
		h.put(msg("x", base+int64(i)*500, 0, fmt.Sprint(i)))
	}
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name        string
		from, until int64
		stopAfter   int   // return stopWith after this many (0: never)
		stopWith    error // ErrStop or another error
		want        []string
		wantErr     error
	}{
		{name: "all", from: 0, until: base + 100_000, want: seq(0, 20)},
		{name: "from is inclusive", from: base + 1500, until: base + 3000, want: seq(3, 6)},
		{name: "until is exclusive", from: base, until: base + 1000, want: seq(0, 2)},
		{name: "mid-second bounds", from: base + 500, until: base + 2500, want: seq(1, 5)},
		{name: "empty range", from: base + 1000, until: base + 1000, want: nil},
		{name: "reversed range", from: base + 5000, until: base, want: nil},
		{name: "before everything", from: 0, until: base, want: nil},
		{name: "after everything", from: base + 10_000, until: base + 20_000, want: nil},
		{name: "until beyond every due time", from: math.MinInt64, until: math.MaxInt64, want: seq(0, 20)},
		{name: "ErrStop ends early without error", from: 0, until: base + 100_000, stopAfter: 3, stopWith: store.ErrStop, want: seq(0, 3)},
		{name: "other error is returned", from: 0, until: base + 100_000, stopAfter: 2, stopWith: errBoom, want: seq(0, 2), wantErr: errBoom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keys []store.Key
			err := h.s.ScanKeys(tc.from, tc.until, func(k store.Key) error {
				if k.Due() < tc.from || k.Due() >= tc.until {
					t.Errorf("key due %d outside [%d, %d)", k.Due(), tc.from, tc.until)
				}
				keys = append(keys, k)
				if len(keys) == tc.stopAfter {
					return tc.stopWith
				}
				return nil
			})
			wantErr(t, "ScanKeys", err, tc.wantErr)
			var got []string
			if len(keys) > 0 {
				got = h.bodies(keys)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// testScanKeysInChunks reads thousands of messages due within a few seconds
// in chunks, the way the scheduler's loader does: ErrStop after a chunk,
// then again from the last due time, skipping the keys already seen.
func testScanKeysInChunks(t *testing.T, h *harness) {
	h.exchange("/", "x")
	h.keys(0, base)
	r := rand.New(rand.NewPCG(5, 6))
	var want []store.Key
	for range 10 {
		var batch []*store.Message
		for range 500 {
			batch = append(batch, msg("x", base-2000+r.Int64N(3)*400, uint8(r.IntN(4)), ""))
		}
		h.put(batch...)
		want = append(want, keysOf(batch)...)
	}
	slices.SortFunc(want, store.CompareKeys)
	var got []store.Key
	var last store.Key
	for {
		n := 0
		err := h.s.ScanKeys(last.Due(), base, func(k store.Key) error {
			if len(got) > 0 && store.CompareKeys(k, last) <= 0 {
				return nil
			}
			got = append(got, k)
			last = k
			if n++; n == 97 {
				return store.ErrStop
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n < 97 {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("chunked scan returned %d keys, want %d in key order", len(got), len(want))
	}
}

// testReopenKeepsEverything: every field of a message, the registry and the
// counts survive a reopen, and new sequences continue after the old ones.
func testReopenKeepsEverything(t *testing.T, h *harness) {
	d := h.exchange("v1", "x")
	h.exchange("v1", "y")
	dt := store.ExchangeDef{VHost: "v1", Name: "", Kind: store.KindDeliveryTime}
	if err := h.s.PutExchange(context.Background(), &dt); err != nil {
		t.Fatalf("PutExchange of a delivery-time exchange: %v", err)
	}
	var msgs []*store.Message
	for i := range 50 {
		m := msg("x", base+int64(i%7)*hour+int64(i), uint8(i%3), fmt.Sprint(i))
		m.VHost = "v1"
		m.MessageID = fmt.Sprintf("id-%d", i%5)
		m.Mandatory = i%2 == 0
		m.Delay = int64(i) * 1000
		if i == 0 { // empty fields, and text beyond ASCII
			m.Properties, m.Body, m.RoutingKey = nil, []byte{}, "clé-ü"
		}
		msgs = append(msgs, m)
	}
	h.put(msgs...)
	h.reopen()
	if got := h.s.Pending(); got != 50 {
		t.Fatalf("Pending after reopen %d, want 50", got)
	}
	if got := h.s.Count("v1", "x"); got != 50 {
		t.Fatalf("Count after reopen %d, want 50", got)
	}
	if got, ok := h.s.Exchange("v1", "x"); !ok || got.VHost != d.VHost || got.Name != d.Name ||
		got.DelayedType != d.DelayedType || got.Durable != d.Durable || got.AutoDelete != d.AutoDelete ||
		got.Internal != d.Internal || !bytes.Equal(got.Arguments, d.Arguments) || got.Incarnation != d.Incarnation {
		t.Fatalf("Exchange after reopen %+v %v, want %+v", got, ok, d)
	}
	for _, want := range []store.ExchangeDef{d, dt} {
		if got, ok := h.s.Exchange(want.VHost, want.Name); !ok || got.Kind != want.Kind || got.Incarnation != want.Incarnation {
			t.Fatalf("Exchange %q after reopen: kind %d, incarnation %d, %v; want kind %d, incarnation %d", want.Name, got.Kind, got.Incarnation, ok, want.Kind, want.Incarnation)
		}
	}
	got, err := h.s.Get(keysOf(msgs))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range got {
		want := *msgs[i]
		if m == nil || m.Key != want.Key || m.VHost != want.VHost || m.Exchange != want.Exchange ||
			m.RoutingKey != want.RoutingKey || m.Mandatory != want.Mandatory || m.Due != want.Due ||
			m.Delay != want.Delay || m.Priority != want.Priority || m.MessageID != want.MessageID ||
			m.Incarnation != want.Incarnation || !bytes.Equal(m.Properties, want.Properties) || !bytes.Equal(m.Body, want.Body) {
			t.Fatalf("message %d after reopen\n got %+v\nwant %+v", i, m, want)
		}
	}
	m := msg("x", base, 0, "new")
	m.VHost = "v1"
	h.put(m)
	for _, old := range msgs {
		if m.Key.Seq() <= old.Key.Seq() {
			t.Fatalf("sequence %d reused after reopen (old %d)", m.Key.Seq(), old.Key.Seq())
		}
	}
}

// testGetAfterDelete: Delete takes messages out of Get, ScanKeys and the
// counts; deleting a missing key or one twice is no error.
func testGetAfterDelete(t *testing.T, h *harness) {
	h.exchange("/", "x")
	h.keys(0, base) // a scan has passed the first two due times
	a, b, c := msg("x", base-5000, 0, "a"), msg("x", base-5000, 0, "b"), msg("x", base+10*hour, 0, "later")
	a.MessageID = "ida"
	h.put(a, b, c)
	for _, step := range []struct {
		del     []store.Key
		want    []string
		pending int64
	}{
		{del: []store.Key{a.Key}, want: []string{"<nil>", "b", "later"}, pending: 2},
		{del: []store.Key{a.Key, store.MakeKey(base, 0, 999999)}, want: []string{"<nil>", "b", "later"}, pending: 2},
		{del: []store.Key{c.Key}, want: []string{"<nil>", "b", "<nil>"}, pending: 1},
		{del: []store.Key{b.Key}, want: []string{"<nil>", "<nil>", "<nil>"}, pending: 0},
	} {
		h.del(step.del...)
		if got := h.bodies([]store.Key{a.Key, b.Key, c.Key}); !slices.Equal(got, step.want) {
			t.Fatalf("after deleting %x: %q, want %q", step.del, got, step.want)
		}
		if got := h.s.Pending(); got != step.pending {
			t.Fatalf("Pending %d, want %d", got, step.pending)
		}
		if got := len(h.keys(0, base+24*hour)); int64(got) != step.pending {
			t.Fatalf("ScanKeys finds %d keys, want %d", got, step.pending)
		}
		h.check()
	}
	if keys, err := h.s.Cancel(context.Background(), "/", "x", "ida"); err != nil || len(keys) != 0 {
		t.Fatalf("Cancel by the id of a deleted message = %x, %v; want none", keys, err)
	}
	if _, ok := h.s.NextDue(); ok {
		t.Fatal("NextDue on an empty store reports a due time")
	}
}

// testPutRefusals: a refused Put stores nothing, whichever message of the
// call is at fault.
func testPutRefusals(t *testing.T, h *harness) {
	ctx := context.Background()
	old := h.exchange("/", "x")
	if _, err := h.s.CancelExchange(ctx, "/", "x"); err != nil {
		t.Fatal(err)
	}
	x, _ := h.s.Exchange("/", "x") // a new incarnation: old's is dead
	with := func(m *store.Message, inc uint64) *store.Message { m.Incarnation = inc; return m }
	otherVHost := msg("x", base, 0, "v")
	otherVHost.VHost = "other"
	for _, tc := range []struct {
		name string
		msgs []*store.Message
		want error
	}{
		{"unknown exchange", []*store.Message{with(msg("nope", base, 0, "a"), x.Incarnation)}, store.ErrUnknownExchange},
		{"unknown vhost", []*store.Message{with(otherVHost, x.Incarnation)}, store.ErrUnknownExchange},
		{"incarnation of a cancelled exchange", []*store.Message{with(msg("x", base, 0, "a"), old.Incarnation)}, store.ErrUnknownExchange},
		{"no incarnation", []*store.Message{with(msg("x", base, 0, "a"), 0)}, store.ErrUnknownExchange},
		{"one bad message fails the call", []*store.Message{
			with(msg("x", base, 0, "ok"), x.Incarnation), with(msg("nope", base, 0, "bad"), x.Incarnation),
		}, store.ErrUnknownExchange},
		{"negative due", []*store.Message{with(msg("x", -1, 0, "a"), x.Incarnation)}, store.ErrInvalidMessage},
		{"due out of range", []*store.Message{with(msg("x", math.MaxInt64, 0, "a"), x.Incarnation)}, store.ErrInvalidMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, "Put", h.s.Put(ctx, tc.msgs...), tc.want)
			if p := h.s.Pending(); p != 0 {
				t.Fatalf("Pending %d after a refused Put", p)
			}
			if n := len(h.keys(0, math.MaxInt64)); n != 0 {
				t.Fatalf("%d keys stored after a refused Put", n)
			}
		})
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	wantErr(t, "Put with a cancelled context", h.s.Put(cctx, with(msg("x", base, 0, "a"), x.Incarnation)), context.Canceled)
	h.check()
}

// testClosedStore: after Close, every method that can fail says ErrClosed.
func testClosedStore(t *testing.T, h *harness) {
	d := h.exchange("/", "x")
	m := msg("x", base, 0, "a")
	h.put(m)
	if err := h.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := context.Background()
	n := msg("x", base, 0, "b")
	n.Incarnation = d.Incarnation
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Close", h.s.Close},
		{"Put", func() error { return h.s.Put(ctx, n) }},
		{"Delete", func() error { return h.s.Delete(ctx, m.Key) }},
		{"Get", func() error { _, err := h.s.Get([]store.Key{m.Key}); return err }},
		{"ScanKeys", func() error { return h.s.ScanKeys(0, base+1, func(store.Key) error { return nil }) }},
		{"List", func() error { _, err := h.s.List("/", "x", store.Key{}, 10, true); return err }},
		{"Cancel", func() error { _, err := h.s.Cancel(ctx, "/", "x", "id"); return err }},
		{"CancelKey", func() error { _, err := h.s.CancelKey(ctx, m.Key); return err }},
		{"CancelExchange", func() error { _, err := h.s.CancelExchange(ctx, "/", "x"); return err }},
		{"PutExchange", func() error {
			return h.s.PutExchange(ctx, &store.ExchangeDef{VHost: "/", Name: "y", DelayedType: "direct"})
		}},
		{"DeleteExchange", func() error { _, err := h.s.DeleteExchange(ctx, "/", "x"); return err }},
	} {
		wantErr(t, tc.name+" after Close", tc.call(), store.ErrClosed)
	}
	if _, ok := h.s.NextDue(); ok {
		t.Fatal("NextDue after Close reports a due time")
	}
}

// testCloseFinishesAcceptedPuts: Puts racing with Close either return nil
// and are stored, or fail with ErrClosed and are not.
func testCloseFinishesAcceptedPuts(t *testing.T, h *harness) {
	h.exchange("/", "x")
	const n = 64
	var wg sync.WaitGroup
	results := make([]error, n)
	msgs := make([]*store.Message, n)
	d, _ := h.s.Exchange("/", "x")
	for i := range n {
		msgs[i] = msg("x", base+int64(i), 0, fmt.Sprint(i))
		msgs[i].Incarnation = d.Incarnation
		wg.Go(func() { results[i] = h.s.Put(context.Background(), msgs[i]) })
	}
	if err := h.s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	h.s = h.open()
	for i, err := range results {
		if err != nil && !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Put %d: %v", i, err)
		}
		if err != nil {
			continue // never got a key: nothing to look up
		}
		if got := h.bodies([]store.Key{msgs[i].Key}); got[0] != fmt.Sprint(i) {
			t.Fatalf("Put %d returned nil but the message is missing", i)
		}
	}
	stored := 0
	for _, err := range results {
		if err == nil {
			stored++
		}
	}
	if p := h.s.Pending(); p != int64(stored) {
		t.Fatalf("Pending %d, %d Puts returned nil", p, stored)
	}
}
