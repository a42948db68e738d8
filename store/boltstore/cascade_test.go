package boltstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// TestCascadeLikeAScheduler walks a horizon over three hours the way the
// scheduler does (ScanKeys window by window, Delete what it released) while
// new messages keep arriving before and after the watermark, with cascade
// passes bounded to a few messages so that every path of a pass runs. Every
// message must come out exactly once, in release order, and Check must
// hold after every window.
func TestCascadeLikeAScheduler(t *testing.T) {
	for _, tc := range []struct {
		name    string
		passMax int
		lead    time.Duration
	}{
		{"unbounded passes", 1 << 30, time.Minute},
		{"small passes", 50, time.Minute},
		{"no lead", 50, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour, CascadeLead: tc.lead})
			h.s.passMax = tc.passMax
			h.exchange("/", "x")
			r := rand.New(rand.NewPCG(7, 8))
			want := map[store.Key]bool{}
			put := func(due int64) {
				m := msg("x", due, uint8(r.IntN(3)), "")
				if r.IntN(4) == 0 {
					m.MessageID = fmt.Sprint(r.IntN(50))
				}
				h.put(m)
				want[m.Key] = true
			}
			const span = 3 * 3600_000
			for range 1500 {
				put(base + r.Int64N(span))
			}
			for range 120 { // one slot fuller than a pass
				put(base + 2*3600_000 + 500)
			}
			var seen []store.Key
			const window = 7 * 60_000
			for now := base; now < base+span+window; now += window {
				var got []store.Key
				if err := h.s.ScanKeys(now, now+window, func(k store.Key) error { got = append(got, k); return nil }); err != nil {
					t.Fatal(err)
				}
				for _, k := range got {
					if k.Due() < now || k.Due() >= now+window {
						t.Fatalf("key due %d outside window [%d, %d)", k.Due(), now, now+window)
					}
					if !want[k] {
						t.Fatalf("key %x returned twice or never stored", k[:])
					}
					delete(want, k)
				}
				seen = append(seen, got...)
				if err := h.s.Delete(context.Background(), got...); err != nil {
					t.Fatal(err)
				}
				// New arrivals: some already behind the watermark (short
				// delays), some far ahead.
				for range 20 {
					put(now + window + r.Int64N(2*window))
					put(now + window + r.Int64N(span))
				}
				h.check()
			}
			for k := range want {
				if k.Due() < base+span+window {
					t.Fatalf("key %x due %d never returned", k[:], k.Due())
				}
			}
			if !slices.IsSortedFunc(seen, store.CompareKeys) {
				t.Fatal("keys not returned in release order across windows")
			}
			st := h.s.Stats()
			if st.Cascades == 0 || st.CascadedMessages == 0 {
				t.Fatalf("no cascade recorded: %+v", st)
			}
			t.Logf("%d released, %d cascade passes moved %d messages", len(seen), st.Cascades, st.CascadedMessages)
		})
	}
}

func TestNextDue(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour})
	h.exchange("/", "x")
	expect := func(want int64, wantOK bool) {
		t.Helper()
		got, ok := h.s.NextDue()
		if ok != wantOK || (ok && got != want) {
			t.Fatalf("NextDue = %d, %v; want %d, %v", got, ok, want, wantOK)
		}
	}
	expect(0, false)
	far1, far2 := msg("x", base+5*3600_000, 0, "far1"), msg("x", base+2*3600_000+7, 0, "far2")
	h.put(far1)
	expect(far1.Due, true) // far buckets only
	h.put(far2)
	expect(far2.Due, true) // a Put lowers the cached far minimum
	if err := h.s.Delete(ctx, far2.Key); err != nil {
		t.Fatal(err)
	}
	expect(far1.Due, true) // deleting the minimum invalidates the cache
	h.keys(0, base)        // watermark to base+1m: the next Put lands in a slot
	slot := msg("x", base+10, 0, "slot")
	h.put(slot)
	expect(slot.Due, true)
	h.reopen()
	expect(slot.Due, true)
	if err := h.s.Delete(ctx, slot.Key); err != nil {
		t.Fatal(err)
	}
	expect(far1.Due, true)
	if err := h.s.Delete(ctx, far1.Key); err != nil {
		t.Fatal(err)
	}
	expect(0, false)
}

func TestListAndCounts(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour})
	h.exchange("/", "x")
	h.exchange("/", "y")
	h.exchange("/", "idle")
	r := rand.New(rand.NewPCG(3, 4))
	var stale []*store.Message
	for range 30 {
		stale = append(stale, msg("x", base+r.Int64N(6*3600_000), 0, "stale"))
	}
	h.put(stale...)
	if _, err := h.s.CancelExchange(ctx, "/", "x"); err != nil {
		t.Fatal(err)
	}
	h.keys(0, base+3600_000) // some in slots, the rest in far buckets
	var xs, ys []*store.Message
	for i := range 40 {
		m := msg("x", base+r.Int64N(6*3600_000), uint8(r.IntN(2)), fmt.Sprint(i))
		xs = append(xs, m)
		ys = append(ys, msg("y", base+r.Int64N(6*3600_000), 0, "y"))
	}
	h.put(xs...)
	h.put(ys...)
	slices.SortFunc(xs, func(a, b *store.Message) int { return store.CompareKeys(a.Key, b.Key) })

	for _, limit := range []int{1, 3, 7, 40, 1000} {
		var got []*store.Message
		var after store.Key
		for pages := 0; ; pages++ {
			page, err := h.s.List("/", "x", after, limit, pages%2 == 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("page of %d with limit %d", len(page), limit)
			}
			for _, m := range page {
				if (pages%2 == 0) != (m.Body != nil) {
					t.Fatalf("withBody=%v but Body %q", pages%2 == 0, m.Body)
				}
			}
			got = append(got, page...)
			if len(page) < limit {
				break
			}
			after = page[len(page)-1].Key
		}
		if len(got) != len(xs) {
			t.Fatalf("limit %d: listed %d, want %d", limit, len(got), len(xs))
		}
		for i, m := range got {
			if m.Key != xs[i].Key || m.Exchange != "x" {
				t.Fatalf("limit %d: item %d is %x, want %x", limit, i, m.Key[:], xs[i].Key[:])
			}
		}
	}
	if _, err := h.s.List("/", "nope", store.Key{}, 10, false); !errors.Is(err, store.ErrUnknownExchange) {
		t.Fatalf("List of an unknown exchange: %v", err)
	}

	minDue := func(ms []*store.Message) int64 {
		return slices.MinFunc(ms, func(a, b *store.Message) int { return store.CompareKeys(a.Key, b.Key) }).Due
	}
	want := []store.ExchangeCount{
		{VHost: "/", Exchange: "idle"},
		{VHost: "/", Exchange: "x", Pending: 40, NextDue: minDue(xs)},
		{VHost: "/", Exchange: "y", Pending: 40, NextDue: minDue(ys)},
	}
	if got := h.s.Counts(); !slices.Equal(got, want) {
		t.Fatalf("Counts = %+v\nwant %+v", got, want)
	}
	// Only far messages left for y: NextDue comes from the far scan.
	var early []store.Key
	for _, m := range ys {
		if m.Due < base+3600_000+60_000 {
			early = append(early, m.Key)
		}
	}
	if err := h.s.Delete(ctx, early...); err != nil {
		t.Fatal(err)
	}
	var rest []*store.Message
	for _, m := range ys {
		if m.Due >= base+3600_000+60_000 {
			rest = append(rest, m)
		}
	}
	if got := h.s.Counts()[2]; got.Pending != int64(len(rest)) || got.NextDue != minDue(rest) {
		t.Fatalf("Counts y = %+v, want pending %d next %d", got, len(rest), minDue(rest))
	}
}

// TestConcurrentUse runs writers, a releasing scheduler, cancellers and
// readers at once (for the race detector), then checks the file.
func TestConcurrentUse(t *testing.T) {
	h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour, MaxBatch: 64})
	h.exchange("/", "x")
	h.exchange("/", "y")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	report := func(err error) {
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrUnknownExchange) {
			select {
			case errs <- err:
			default:
			}
		}
	}
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ctx.Err() == nil && i < 300; i++ {
				ex := []string{"x", "y"}[r.IntN(2)]
				m := msg(ex, base+r.Int64N(4*3600_000), uint8(r.IntN(4)), "b")
				m.MessageID = fmt.Sprint(r.IntN(20))
				report(h.s.Put(ctx, m))
			}
		}()
	}
	wg.Add(1)
	go func() { // the scheduler
		defer wg.Done()
		for now := base; now < base+4*3600_000 && ctx.Err() == nil; now += 10 * 60_000 {
			var keys []store.Key
			report(h.s.ScanKeys(now, now+10*60_000, func(k store.Key) error { keys = append(keys, k); return nil }))
			ms, err := h.s.Get(keys)
			report(err)
			for _, m := range ms {
				if m != nil {
					h.s.Stale(m)
				}
			}
			report(h.s.Delete(ctx, keys...))
			h.s.NextDue()
		}
	}()
	wg.Add(1)
	go func() { // admin
		defer wg.Done()
		r := rand.New(rand.NewPCG(9, 9))
		for i := 0; i < 50 && ctx.Err() == nil; i++ {
			_, err := h.s.Cancel(ctx, "/", "x", fmt.Sprint(r.IntN(20)))
			report(err)
			_, err = h.s.List("/", "y", store.Key{}, 20, false)
			report(err)
			h.s.Counts()
			h.s.Pending()
			if i%10 == 0 {
				_, err = h.s.CancelExchange(ctx, "/", "y")
				report(err)
			}
			if i == 25 {
				_, err = h.s.DeleteExchange(ctx, "/", "x")
				report(err)
				d := store.ExchangeDef{VHost: "/", Name: "x", DelayedType: "topic"}
				report(h.s.PutExchange(ctx, &d))
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h.check()
}

// TestCascadeWritesDuringScan holds a cascade scan while Puts and Deletes
// commit into the range it covers, including a far bucket created after the
// scan began and lying before the one scanned.
func TestCascadeWritesDuringScan(t *testing.T) {
	h := newHarness(t, Options{NoSync: true, FarWidth: time.Hour, CascadeLead: time.Millisecond})
	h.exchange("/", "x")
	ctx := context.Background()
	hour := int64(3600_000)
	start := base / hour * hour
	h.keys(0, start)                                 // watermark at start
	before := msg("x", start+5*hour+10, 0, "before") // in the far bucket the scan reads
	doomed := msg("x", start+5*hour+20, 0, "doomed") // deleted during the scan
	h.put(before, doomed)
	scanning, release := make(chan struct{}), make(chan struct{})
	h.s.scanHook = func() { close(scanning); <-release }
	type result struct {
		keys []store.Key
		err  error
	}
	done := make(chan result)
	go func() {
		var keys []store.Key
		err := h.s.ScanKeys(start, start+6*hour, func(k store.Key) error { keys = append(keys, k); return nil })
		done <- result{keys, err}
	}()
	<-scanning
	late := msg("x", start+5*hour+30, 0, "late")  // same far bucket, after the snapshot
	gap := msg("x", start+2*hour, 0, "gap")       // a new far bucket before the scanned one
	beyond := msg("x", start+7*hour, 0, "beyond") // outside the range
	h.put(late, gap, beyond)
	if err := h.s.Delete(ctx, doomed.Key); err != nil {
		t.Fatal(err)
	}
	h.check()
	close(release)
	res := <-done
	h.s.scanHook = nil
	if res.err != nil {
		t.Fatal(res.err)
	}
	if got, want := bodies(t, h.s, res.keys), []string{"gap", "before", "late"}; !slices.Equal(got, want) {
		t.Fatalf("scanned %q, want %q", got, want)
	}
	if got := bodies(t, h.s, []store.Key{beyond.Key, doomed.Key}); !slices.Equal(got, []string{"beyond", "<nil>"}) {
		t.Fatalf("beyond/doomed: %q", got)
	}
	if p := h.s.Pending(); p != 4 {
		t.Fatalf("Pending %d, want 4", p)
	}
}

// TestScanBusySlotInChunks reads a slot of thousands of messages in chunks
// the way the scheduler's loader does (ErrStop after a chunk, then again
// from the last due time, skipping keys already seen).
func TestScanBusySlotInChunks(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	h.exchange("/", "x")
	h.keys(0, base) // slots from here on
	r := rand.New(rand.NewPCG(5, 6))
	var want []store.Key
	for range 10 {
		var batch []*store.Message
		for range 500 {
			m := msg("x", base-2000+r.Int64N(3)*400, uint8(r.IntN(4)), "")
			batch = append(batch, m)
		}
		h.put(batch...)
		for _, m := range batch {
			want = append(want, m.Key)
		}
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
