package boltstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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
