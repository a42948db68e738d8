package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// testNextDue: the earliest stored due time, whether or not a scan passed
// it, through puts, deletes and a reopen.
func testNextDue(t *testing.T, h *harness) {
	h.exchange("/", "x")
	expect := func(want int64, wantOK bool) {
		t.Helper()
		got, ok := h.s.NextDue()
		if ok != wantOK || (ok && got != want) {
			t.Fatalf("NextDue = %d, %v; want %d, %v", got, ok, want, wantOK)
		}
	}
	expect(0, false)
	later1, later2 := msg("x", base+5*hour, 0, "later1"), msg("x", base+2*hour+7, 0, "later2")
	h.put(later1)
	expect(later1.Due, true)
	h.put(later2)
	expect(later2.Due, true) // a Put lowers it
	h.del(later2.Key)
	expect(later1.Due, true) // deleting the earliest raises it
	h.keys(0, base)          // a scan passes base: the next Put is behind it
	near := msg("x", base+10, 0, "near")
	h.put(near)
	expect(near.Due, true)
	h.reopen()
	expect(near.Due, true)
	h.del(near.Key)
	expect(later1.Due, true)
	h.del(later1.Key)
	expect(0, false)
}

// testListAndCounts: List pages through one exchange's pending messages in
// release order (stale ones left out, with or without bodies); Counts gives
// every exchange its pending count and earliest due time.
func testListAndCounts(t *testing.T, h *harness) {
	ctx := context.Background()
	h.exchange("/", "x")
	h.exchange("/", "y")
	h.exchange("/", "idle")
	r := rand.New(rand.NewPCG(3, 4))
	var stale []*store.Message
	for range 30 {
		stale = append(stale, msg("x", base+r.Int64N(6*hour), 0, "stale"))
	}
	h.put(stale...)
	if _, err := h.s.CancelExchange(ctx, "/", "x"); err != nil {
		t.Fatal(err)
	}
	h.keys(0, base+hour) // a scan passed the first hour
	var xs, ys []*store.Message
	for i := range 40 {
		xs = append(xs, msg("x", base+r.Int64N(6*hour), uint8(r.IntN(2)), fmt.Sprint(i)))
		ys = append(ys, msg("y", base+r.Int64N(6*hour), 0, "y"))
	}
	h.put(xs...)
	h.put(ys...)
	byKey := func(a, b *store.Message) int { return store.CompareKeys(a.Key, b.Key) }
	slices.SortFunc(xs, byKey)

	for _, limit := range []int{1, 3, 7, 40, 1000} {
		var got []*store.Message
		var after store.Key
		for pages := 0; ; pages++ {
			withBody := pages%2 == 0
			page, err := h.s.List("/", "x", after, limit, withBody)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("page of %d with limit %d", len(page), limit)
			}
			for _, m := range page {
				if withBody != (m.Body != nil) {
					t.Fatalf("withBody=%v but Body %q", withBody, m.Body)
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
	if page, err := h.s.List("/", "x", store.Key{}, 0, false); err != nil || len(page) != len(xs) {
		t.Fatalf("List with limit 0 (the default, 100): %d messages, %v; want %d", len(page), err, len(xs))
	}
	if _, err := h.s.List("/", "nope", store.Key{}, 10, false); !errors.Is(err, store.ErrUnknownExchange) {
		t.Fatalf("List of an unknown exchange: %v", err)
	}

	minDue := func(ms []*store.Message) int64 { return slices.MinFunc(ms, byKey).Due }
	want := []store.ExchangeCount{
		{VHost: "/", Exchange: "idle"},
		{VHost: "/", Exchange: "x", Pending: 40, NextDue: minDue(xs)},
		{VHost: "/", Exchange: "y", Pending: 40, NextDue: minDue(ys)},
	}
	if got := h.s.Counts(); !slices.Equal(got, want) {
		t.Fatalf("Counts = %+v\nwant %+v", got, want)
	}
	// Only messages beyond the scan left for y.
	var early, rest []*store.Message
	for _, m := range ys {
		if m.Due < base+hour+minute {
			early = append(early, m)
		} else {
			rest = append(rest, m)
		}
	}
	h.del(keysOf(early)...)
	if got := h.s.Counts()[2]; got.Pending != int64(len(rest)) || got.NextDue != minDue(rest) {
		t.Fatalf("Counts y = %+v, want pending %d next %d", got, len(rest), minDue(rest))
	}
	h.check()
}

// testUpcoming: counts by due minute into the caller's ranges, stale
// messages included until deleted, across deletes and a reopen.
func testUpcoming(t *testing.T, h *harness) {
	ctx := context.Background()
	h.exchange("/", "x")
	h.exchange("/", "y")
	now := base / minute * minute // a whole minute
	h.keys(0, now+30_000)         // a scan passed the first half minute
	// Due times relative to now, by the range they fall in.
	dues := map[string][]int64{
		"overdue":     {-3 * hour, -1},
		"next minute": {0, 1, 59_999},
		"next hour":   {minute, 30 * minute, hour - 1},
		"next day":    {hour, 23 * hour},
		"next week":   {24 * hour, 6 * 24 * hour},
		"later":       {7 * 24 * hour, 400 * 24 * hour},
	}
	names := []string{"overdue", "next minute", "next hour", "next day", "next week", "later"}
	bounds := []int64{now, now + minute, now + hour, now + 24*hour, now + 7*24*hour}
	var xs, ys []*store.Message
	for _, name := range names {
		for _, d := range dues[name] {
			xs = append(xs, msg("x", now+d, 0, name))
			ys = append(ys, msg("y", now+d, 0, name))
		}
	}
	h.put(xs...)
	h.put(ys...)
	expect := func(when string, bounds []int64, want []int64) {
		t.Helper()
		if got := h.s.Upcoming(bounds); !slices.Equal(got, want) {
			t.Fatalf("%s: Upcoming(%v) = %v, want %v", when, bounds, got, want)
		}
	}
	expect("every range twice", bounds, []int64{4, 6, 6, 4, 4, 4})
	expect("no bounds", nil, []int64{28})
	expect("one bound", []int64{now + hour}, []int64{16, 12})
	expect("equal bounds make an empty range", []int64{now + hour, now + hour}, []int64{16, 0, 12})
	expect("a bound within a minute counts by the minute", []int64{now + 30_000}, []int64{10, 18})

	// A cancelled exchange's messages count until deleted.
	if _, err := h.s.CancelExchange(ctx, "/", "y"); err != nil {
		t.Fatal(err)
	}
	expect("after CancelExchange", bounds, []int64{4, 6, 6, 4, 4, 4})
	var gone []store.Key
	for _, m := range append(xs, ys...) {
		if m.Body[0] == 'n' && m.Due < now+hour { // the next minute and hour
			gone = append(gone, m.Key)
		}
	}
	h.del(gone...)
	expect("after deleting the next hour", bounds, []int64{4, 0, 0, 4, 4, 4})
	h.reopen()
	expect("after reopen", bounds, []int64{4, 0, 0, 4, 4, 4})
	if p, s := h.s.Pending(), h.stale(); p != 8 || s != 8 {
		t.Fatalf("Pending %d, stale %d; want 8 and 8", p, s)
	}
	h.check()
}
