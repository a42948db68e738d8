package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/store"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	goleak.VerifyTestMain(m)
}

// base is an arbitrary due time (2027) that keeps tests off the wall clock.
const base = int64(1_800_000_000_000)

// harness is a store in a temp dir whose cleanup checks it: still open, or
// reopened when the test closed it.
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
		err := h.s.Check()
		if errors.Is(err, store.ErrClosed) {
			h.s = h.open()
			err = h.s.Check()
		}
		if err != nil {
			t.Errorf("Check: %v", err)
		}
		if err := h.s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
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
	d := store.ExchangeDef{VHost: vhost, Name: name, DelayedType: "direct", Durable: true, Arguments: []byte{0, 0, 0, 0}}
	if err := h.s.PutExchange(context.Background(), &d); err != nil {
		h.t.Fatalf("PutExchange: %v", err)
	}
	return d
}

func (h *harness) put(msgs ...*store.Message) {
	h.t.Helper()
	if err := h.s.Put(context.Background(), msgs...); err != nil {
		h.t.Fatalf("Put: %v", err)
	}
}

func (h *harness) check() {
	h.t.Helper()
	if err := h.s.Check(); err != nil {
		h.t.Fatalf("Check: %v", err)
	}
}

// keys returns every key due in [from, until) via ScanKeys.
func (h *harness) keys(from, until int64) []store.Key {
	h.t.Helper()
	var out []store.Key
	if err := h.s.ScanKeys(from, until, func(k store.Key) error { out = append(out, k); return nil }); err != nil {
		h.t.Fatalf("ScanKeys: %v", err)
	}
	return out
}

func msg(exchange string, due int64, prio uint8, body string) *store.Message {
	return &store.Message{
		VHost: "/", Exchange: exchange, RoutingKey: "rk." + body, Due: due, Delay: 1000,
		Priority: prio, Body: []byte(body), Properties: []byte{0x80, 0x00, 0x03, 'a', '/', 'b'},
	}
}

func bodies(t *testing.T, s *Store, keys []store.Key) []string {
	t.Helper()
	ms, err := s.Get(keys)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		if m == nil {
			out[i] = "<nil>"
		} else {
			out[i] = string(m.Body)
		}
	}
	return out
}

func TestReleaseOrder(t *testing.T) {
	type in struct {
		due  int64
		prio uint8
		body string
	}
	for _, tc := range []struct {
		name   string
		scanAt int64 // ScanKeys(0, scanAt) before publishing, to move the watermark (0: none)
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
			name: "due before priority",
			msgs: []in{{1001, 0, "late-low"}, {1000, 0, "early-low"}, {1001, 255, "late-high"}},
			want: []string{"early-low", "late-high", "late-low"},
		},
		{
			name:   "slotted and far messages interleave",
			scanAt: base + 5000, // messages due before base+65s go straight to slots
			msgs: []in{
				{200_000, 0, "far2"}, {1000, 0, "slot1"}, {100_000, 3, "far1-p3"}, {100_000, 3, "far1-p3b"},
				{4 * 3600_000, 0, "far3"}, {1000, 7, "slot1-p7"}, {30_000, 0, "slot2"}, {100_000, 4, "far1-p4"},
			},
			want: []string{"slot1-p7", "slot1", "slot2", "far1-p4", "far1-p3", "far1-p3b", "far2", "far3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour})
			h.exchange("/", "x")
			if tc.scanAt != 0 {
				h.keys(0, tc.scanAt)
			}
			for _, m := range tc.msgs {
				h.put(msg("x", base+m.due, m.prio, m.body))
			}
			keys := h.keys(0, base+48*3600_000)
			if got := bodies(t, h.s, keys); !slices.Equal(got, tc.want) {
				t.Fatalf("release order %q, want %q", got, tc.want)
			}
			if !slices.IsSortedFunc(keys, store.CompareKeys) {
				t.Fatalf("keys not sorted: %x", keys)
			}
			h.reopen()
			if got := bodies(t, h.s, h.keys(0, base+48*3600_000)); !slices.Equal(got, tc.want) {
				t.Fatalf("after reopen %q, want %q", got, tc.want)
			}
		})
	}
}

func TestScanRanges(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	// Messages at 0.5 s steps from base: two per 1 s slot.
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
		{name: "mid-slot bounds", from: base + 500, until: base + 2500, want: seq(1, 5)},
		{name: "empty range", from: base + 1000, until: base + 1000, want: nil},
		{name: "reversed range", from: base + 5000, until: base, want: nil},
		{name: "before everything", from: 0, until: base, want: nil},
		{name: "after everything", from: base + 10_000, until: base + 20_000, want: nil},
		{name: "until beyond every due time", from: math.MinInt64, until: math.MaxInt64, want: seq(0, 20)},
		{name: "ErrStop ends early without error", from: 0, until: base + 100_000, stopAfter: 3, stopWith: store.ErrStop, want: seq(0, 3)},
		{name: "other error is returned", from: 0, until: base + 100_000, stopAfter: 2, stopWith: errBoom, want: seq(0, 2), wantErr: errBoom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, mode := range []string{"Scan", "ScanKeys"} {
				var got []string
				var keys []store.Key
				var err error
				if mode == "Scan" {
					err = h.s.Scan(tc.from, tc.until, func(m *store.Message) error {
						if m.Due < tc.from || m.Due >= tc.until {
							t.Errorf("message due %d outside [%d, %d)", m.Due, tc.from, tc.until)
						}
						got = append(got, string(m.Body))
						if len(got) == tc.stopAfter {
							return tc.stopWith
						}
						return nil
					})
				} else {
					err = h.s.ScanKeys(tc.from, tc.until, func(k store.Key) error {
						keys = append(keys, k)
						if len(keys) == tc.stopAfter {
							return tc.stopWith
						}
						return nil
					})
					got = nil
					if len(keys) > 0 {
						got = bodies(t, h.s, keys)
					}
				}
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Fatalf("%s error %v, want %v", mode, err, tc.wantErr)
				}
				if !slices.Equal(got, tc.want) {
					t.Fatalf("%s got %q, want %q", mode, got, tc.want)
				}
			}
		})
	}
}

func seq(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprint(i))
	}
	return out
}

func TestReopenKeepsEverything(t *testing.T) {
	h := newHarness(t, Options{})
	d := h.exchange("v1", "x")
	h.exchange("v1", "y")
	var msgs []*store.Message
	for i := range 50 {
		m := msg("x", base+int64(i%7)*3600_000+int64(i), uint8(i%3), fmt.Sprint(i))
		m.VHost = "v1"
		m.MessageID = fmt.Sprintf("id-%d", i%5)
		m.Mandatory = i%2 == 0
		m.Delay = int64(i) * 1000
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
	if got, ok := h.s.Exchange("v1", "x"); !ok || !equalDef(got, d) {
		t.Fatalf("Exchange after reopen %+v %v, want %+v", got, ok, d)
	}
	keys := make([]store.Key, len(msgs))
	for i, m := range msgs {
		keys[i] = m.Key
	}
	got, err := h.s.Get(keys)
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
	// New sequences continue after the old ones.
	m := msg("x", base, 0, "new")
	m.VHost = "v1"
	h.put(m)
	for _, old := range msgs {
		if m.Key.Seq() <= old.Key.Seq() {
			t.Fatalf("sequence %d reused after reopen (old %d)", m.Key.Seq(), old.Key.Seq())
		}
	}
}

func TestGetAfterDelete(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	h.keys(0, base) // watermark past base: these land in slots
	a, b, c := msg("x", base-5000, 0, "a"), msg("x", base-5000, 0, "b"), msg("x", base+10*3600_000, 0, "far")
	a.MessageID = "ida"
	h.put(a, b, c)
	ctx := context.Background()
	for _, step := range []struct {
		del     []store.Key
		want    []string
		pending int64
	}{
		{del: []store.Key{a.Key}, want: []string{"<nil>", "b", "far"}, pending: 2},
		{del: []store.Key{a.Key, store.MakeKey(base, 0, 999999)}, want: []string{"<nil>", "b", "far"}, pending: 2}, // missing keys are fine
		{del: []store.Key{c.Key}, want: []string{"<nil>", "b", "<nil>"}, pending: 1},
		{del: []store.Key{b.Key}, want: []string{"<nil>", "<nil>", "<nil>"}, pending: 0}, // drains the slot
	} {
		if err := h.s.Delete(ctx, step.del...); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if got := bodies(t, h.s, []store.Key{a.Key, b.Key, c.Key}); !slices.Equal(got, step.want) {
			t.Fatalf("after deleting %x: %q, want %q", step.del, got, step.want)
		}
		if got := h.s.Pending(); got != step.pending {
			t.Fatalf("Pending %d, want %d", got, step.pending)
		}
		h.check()
	}
	if err := h.s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketSlots).Cursor().First(); k != nil {
			t.Errorf("slot %x left after its last message was deleted", k)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.s.NextDue(); ok {
		t.Fatal("NextDue on an empty store reports a due time")
	}
}

func TestCancel(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		moveMark   bool // move the watermark so the messages sit in slots
		cancelID   string
		cancelEx   string
		wantN      int
		wantLeft   []string
		wantCountX int64
	}{
		{name: "id in far buckets", cancelID: "dup", cancelEx: "x", wantN: 2, wantLeft: []string{"1", "3", "y-dup"}, wantCountX: 2},
		{name: "id in slots", moveMark: true, cancelID: "dup", cancelEx: "x", wantN: 2, wantLeft: []string{"1", "3", "y-dup"}, wantCountX: 2},
		{name: "unique id", cancelID: "one", cancelEx: "x", wantN: 1, wantLeft: []string{"0", "2", "3", "y-dup"}, wantCountX: 3},
		{name: "unknown id", cancelID: "nope", cancelEx: "x", wantN: 0, wantLeft: []string{"0", "1", "2", "3", "y-dup"}, wantCountX: 4},
		{name: "other exchange", cancelID: "dup", cancelEx: "y", wantN: 1, wantLeft: []string{"0", "1", "2", "3"}, wantCountX: 4},
		{name: "id prefix does not match", cancelID: "du", cancelEx: "x", wantN: 0, wantLeft: []string{"0", "1", "2", "3", "y-dup"}, wantCountX: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{NoSync: true})
			h.exchange("/", "x")
			h.exchange("/", "y")
			if tc.moveMark {
				h.keys(0, base+10*3600_000)
			}
			var keys []store.Key
			for i, id := range []string{"dup", "one", "dup", ""} {
				m := msg("x", base+int64(i)*1000, 0, fmt.Sprint(i))
				m.MessageID = id
				h.put(m)
				keys = append(keys, m.Key)
			}
			y := msg("y", base, 0, "y-dup")
			y.MessageID = "dup"
			h.put(y)
			keys = append(keys, y.Key)
			n, err := h.s.Cancel(ctx, "/", tc.cancelEx, tc.cancelID)
			if err != nil || n != tc.wantN {
				t.Fatalf("Cancel = %d, %v; want %d", n, err, tc.wantN)
			}
			var left []string
			for _, b := range bodies(t, h.s, keys) {
				if b != "<nil>" {
					left = append(left, b)
				}
			}
			if !slices.Equal(left, tc.wantLeft) {
				t.Fatalf("left %q, want %q", left, tc.wantLeft)
			}
			if got := h.s.Count("/", "x"); got != tc.wantCountX {
				t.Fatalf("Count x = %d, want %d", got, tc.wantCountX)
			}
			h.check()
		})
	}
	t.Run("by key", func(t *testing.T) {
		h := newHarness(t, Options{NoSync: true})
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
		if got := bodies(t, h.s, []store.Key{a.Key, b.Key}); !slices.Equal(got, []string{"<nil>", "b"}) {
			t.Fatalf("after CancelKey: %q", got)
		}
		if n, _ := h.s.Cancel(ctx, "/", "x", "ida"); n != 0 {
			t.Fatalf("Cancel by the id of a cancelled message = %d, want 0", n)
		}
	})
}

func TestExchangeLifecycle(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Options{NoSync: true})
	x1 := h.exchange("/", "x")
	h.exchange("/", "other")
	if again := h.exchange("/", "x"); again.Incarnation != x1.Incarnation {
		t.Fatalf("re-declaring keeps the incarnation: got %d, want %d", again.Incarnation, x1.Incarnation)
	}
	var old []*store.Message
	for i := range 10 {
		m := msg("x", base+int64(i)*3600_000, 0, fmt.Sprint(i))
		m.MessageID = "id"
		old = append(old, m)
	}
	h.put(old...)
	h.put(msg("other", base, 0, "o"))

	// CancelExchange: all 10 become stale, the exchange stays.
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
	if got := h.s.Count("/", "x"); got != 0 {
		t.Fatalf("Count after CancelExchange = %d, want 0", got)
	}
	if p, st := h.s.Pending(), h.s.Stats().Stale; p != 1 || st != 10 {
		t.Fatalf("Pending %d Stale %d, want 1 and 10", p, st)
	}
	fresh := msg("x", base+1, 0, "fresh")
	fresh.MessageID = "id"
	h.put(fresh)
	if h.s.Stale(fresh) || h.s.Count("/", "x") != 1 {
		t.Fatalf("fresh message: stale %v count %d", h.s.Stale(fresh), h.s.Count("/", "x"))
	}
	h.check()

	// The scheduler deletes two stale messages: stale count drops, live stays.
	if err := h.s.Delete(ctx, old[0].Key, old[1].Key); err != nil {
		t.Fatal(err)
	}
	if p, st, c := h.s.Pending(), h.s.Stats().Stale, h.s.Count("/", "x"); p != 2 || st != 8 || c != 1 {
		t.Fatalf("after deleting stale: Pending %d Stale %d Count %d, want 2, 8, 1", p, st, c)
	}
	// Cancel by id removes stale and live ones with that id, counts the live one.
	if n, err := h.s.Cancel(ctx, "/", "x", "id"); err != nil || n != 1 {
		t.Fatalf("Cancel = %d, %v; want 1", n, err)
	}
	if st := h.s.Stats().Stale; st != 0 {
		t.Fatalf("Stale after Cancel by id = %d, want 0", st)
	}
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
	if err := h.s.Put(ctx, msg("x", base, 0, "nope")); !errors.Is(err, store.ErrUnknownExchange) {
		t.Fatalf("Put to a deleted exchange: %v, want ErrUnknownExchange", err)
	}
	if _, err := h.s.DeleteExchange(ctx, "/", "x"); !errors.Is(err, store.ErrUnknownExchange) {
		t.Fatalf("DeleteExchange twice: %v, want ErrUnknownExchange", err)
	}
	if _, err := h.s.CancelExchange(ctx, "/", "x"); !errors.Is(err, store.ErrUnknownExchange) {
		t.Fatalf("CancelExchange of a deleted exchange: %v, want ErrUnknownExchange", err)
	}
	x3 := h.exchange("/", "x")
	if x3.Incarnation == x2.Incarnation || x3.Incarnation == x1.Incarnation {
		t.Fatalf("re-created exchange reuses incarnation %d", x3.Incarnation)
	}
	h.reopen()
	if !h.s.Stale(m3) || h.s.Count("/", "x") != 0 || h.s.Pending() != 1 || h.s.Stats().Stale != 1 {
		t.Fatalf("after re-create and reopen: stale %v count %d pending %d stale %d",
			h.s.Stale(m3), h.s.Count("/", "x"), h.s.Pending(), h.s.Stats().Stale)
	}
	if got := h.s.Exchanges(); len(got) != 2 {
		t.Fatalf("Exchanges = %+v, want 2", got)
	}
}

func TestOpenForeignFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	boltFile := func(name string, fn func(*bolt.Tx) error) string {
		p := filepath.Join(dir, name)
		db, err := bolt.Open(p, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fn != nil {
			if err := db.Update(fn); err != nil {
				t.Fatal(err)
			}
		}
		db.Close()
		return p
	}
	random := make([]byte, 64<<10)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(r.Uint32())
	}
	newer := filepath.Join(dir, "newer.db")
	s, err := Open(newer, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(newer, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaVersion, u64(schemaVersion+1)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	for _, tc := range []struct {
		name string
		path string
		want error
	}{
		{"random bytes", write("random.db", random), ErrNotStore},
		{"text file", write("text.db", bytes.Repeat([]byte("hello world\n"), 1000)), ErrNotStore},
		{"short file", write("short.db", make([]byte, 5000)), ErrNotStore},
		{"tiny file", write("tiny.db", []byte("hi")), ErrNotStore},
		{"empty file", write("empty.db", nil), ErrNotStore},
		{"directory", dir, ErrNotStore},
		{"empty bbolt file", boltFile("emptybolt.db", nil), ErrNotStore},
		{"someone else's bbolt file", boltFile("other.db", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("meta"))
			if err != nil {
				return err
			}
			return b.Put([]byte("magic"), []byte("not us"))
		}), ErrNotStore},
		{"newer schema", newer, ErrSchemaTooNew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(tc.path)
			s, err := Open(tc.path, Options{NoSync: true})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open: %v, want %v", err, tc.want)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.path) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q should be one line naming the path", msg)
			}
			if after, _ := os.ReadFile(tc.path); !bytes.Equal(before, after) {
				t.Fatal("Open modified a file it refused")
			}
		})
	}
}

func TestOpenLocked(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	_, err := Open(h.path, Options{NoSync: true, LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
}

func TestOptionsRecordedAtCreation(t *testing.T) {
	h := newHarness(t, Options{NoSync: true, SlotWidth: 10 * time.Millisecond, FarWidth: time.Second})
	h.exchange("/", "x")
	h.put(msg("x", base+15, 0, "a"))
	h.opts = Options{NoSync: true} // defaults now differ; the file's widths win
	h.reopen()
	if h.s.slotMs != 10 || h.s.farMs != 1000 {
		t.Fatalf("widths after reopen %d/%d ms, want 10/1000", h.s.slotMs, h.s.farMs)
	}
	if got := bodies(t, h.s, h.keys(0, base+100)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("got %q", got)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{SlotWidth: time.Second, FarWidth: 1500 * time.Millisecond}); err == nil {
		t.Fatal("FarWidth not a multiple of SlotWidth accepted")
	}
}

func TestGroupCommitSharesCommits(t *testing.T) {
	var mu sync.Mutex
	var infos []store.CommitInfo
	h := newHarness(t, Options{OnCommit: func(ci store.CommitInfo) { mu.Lock(); infos = append(infos, ci); mu.Unlock() }})
	h.exchange("/", "x")
	before := h.s.Stats()
	const writers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := h.s.Put(context.Background(), msg("x", base+int64(w*each+i), 0, "b")); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := h.s.Stats()
	commits, msgs := st.Commits-before.Commits, st.Messages-before.Messages
	if msgs != writers*each {
		t.Fatalf("Stats.Messages %d, want %d", msgs, writers*each)
	}
	if commits >= writers*each {
		t.Fatalf("%d commits for %d fsync'd Puts from %d goroutines: no group commit", commits, msgs, writers)
	}
	if st.MaxBatch < 2 || st.CommitTime <= 0 {
		t.Fatalf("Stats %+v: want MaxBatch > 1 and CommitTime > 0", st)
	}
	mu.Lock()
	defer mu.Unlock()
	sum := 0
	for _, ci := range infos {
		sum += ci.Messages
	}
	if sum != writers*each+0 || uint64(len(infos)) != st.Commits {
		t.Fatalf("OnCommit saw %d messages in %d commits; Stats %d commits", sum, len(infos), st.Commits)
	}
	t.Logf("%d Puts in %d commits (largest %d)", msgs, commits, st.MaxBatch)
}

func TestClosedStore(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	m := msg("x", base, 0, "a")
	h.put(m)
	if err := h.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx := context.Background()
	if err := h.s.Close(); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if err := h.s.Put(ctx, msg("x", base, 0, "b")); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := h.s.Delete(ctx, m.Key); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Delete after Close: %v", err)
	}
	if _, err := h.s.Get([]store.Key{m.Key}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := h.s.ScanKeys(0, base+1, func(store.Key) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("ScanKeys after Close: %v", err)
	}
	if _, err := h.s.List("/", "x", store.Key{}, 10, true); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("List after Close: %v", err)
	}
	if _, ok := h.s.NextDue(); ok {
		t.Fatal("NextDue after Close reports a due time")
	}
}

func TestCloseWaitsForQueuedPuts(t *testing.T) {
	h := newHarness(t, Options{})
	h.exchange("/", "x")
	const n = 64
	var wg sync.WaitGroup
	results := make([]error, n)
	msgs := make([]*store.Message, n)
	for i := range n {
		msgs[i] = msg("x", base+int64(i), 0, fmt.Sprint(i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = h.s.Put(context.Background(), msgs[i])
		}()
	}
	if err := h.s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	h.s = h.open()
	for i, err := range results {
		got, gerr := h.s.Get([]store.Key{msgs[i].Key})
		if gerr != nil {
			t.Fatal(gerr)
		}
		switch {
		case err == nil && got[0] == nil:
			t.Fatalf("Put %d returned nil but the message is missing", i)
		case err != nil && !errors.Is(err, store.ErrClosed):
			t.Fatalf("Put %d: %v", i, err)
		case err != nil && got[0] != nil && msgs[i].Key != (store.Key{}):
			t.Fatalf("Put %d failed with %v but the message is stored", i, err)
		}
	}
}

func TestPutRefusals(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		msgs []*store.Message
		want error
	}{
		{"unknown exchange", []*store.Message{msg("nope", base, 0, "a")}, store.ErrUnknownExchange},
		{"unknown vhost", []*store.Message{{VHost: "other", Exchange: "x", Due: base}}, store.ErrUnknownExchange},
		{"one bad message fails the call", []*store.Message{msg("x", base, 0, "ok"), msg("nope", base, 0, "bad")}, store.ErrUnknownExchange},
		{"negative due", []*store.Message{msg("x", -1, 0, "a")}, store.ErrInvalidMessage},
		{"due too far", []*store.Message{msg("x", maxDue, 0, "a")}, store.ErrInvalidMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.s.Put(ctx, tc.msgs...); !errors.Is(err, tc.want) {
				t.Fatalf("Put: %v, want %v", err, tc.want)
			}
			if p := h.s.Pending(); p != 0 {
				t.Fatalf("Pending %d after a refused Put", p)
			}
		})
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := h.s.Put(cctx, msg("x", base, 0, "a")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context: %v", err)
	}
}

func TestDiskFull(t *testing.T) {
	// MaxSize makes bbolt refuse to grow the file, as a full disk would.
	h := newHarness(t, Options{MaxSize: 1 << 20, InitialMmapSize: 1 << 20})
	h.exchange("/", "x")
	ctx := context.Background()
	body := strings.Repeat("z", 8<<10)
	type result struct {
		m   *store.Message
		err error
	}
	var results []result
	var mu sync.Mutex
	for round := 0; round < 50; round++ {
		var wg sync.WaitGroup
		for i := range 8 {
			m := msg("x", base+int64(round*8+i)*60_000, 0, body)
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := h.s.Put(ctx, m)
				mu.Lock()
				results = append(results, result{m, err})
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	var ok, full int
	for _, r := range results {
		got, err := h.s.Get([]store.Key{r.m.Key})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case r.err == nil:
			ok++
			if got[0] == nil || string(got[0].Body) != body {
				t.Fatalf("Put returned nil but message %x is missing", r.m.Key)
			}
		case errors.Is(r.err, store.ErrFull):
			full++
			if got[0] != nil {
				t.Fatalf("Put failed with %v but message %x is stored", r.err, r.m.Key)
			}
		default:
			t.Fatalf("Put: %v, want nil or ErrFull", r.err)
		}
	}
	if full == 0 || ok == 0 {
		t.Fatalf("%d stored, %d refused: want both", ok, full)
	}
	if st := h.s.Stats(); st.FailedCommits == 0 || h.s.Pending() != int64(ok) {
		t.Fatalf("FailedCommits %d, Pending %d, stored %d", st.FailedCommits, h.s.Pending(), ok)
	}
	h.check()
	// With room again (a bigger limit), writes work.
	h.opts.MaxSize = 0
	h.reopen()
	h.put(msg("x", base, 0, "after"))
	t.Logf("%d stored, %d refused with ErrFull", ok, full)
}
