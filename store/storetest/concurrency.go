package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// testConcurrentUse runs writers, a releasing scheduler, cancellers and
// readers at once (for the race detector), then checks the store.
func testConcurrentUse(t *testing.T, h *harness) {
	h.exchange("/", "x")
	h.exchange("/", "y")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	report := func(err error) {
		// The admin re-creates x and cancels y meanwhile: Puts with an
		// incarnation gone meanwhile are refused, as they should be.
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrUnknownExchange) {
			select {
			case errs <- err:
			default:
			}
		}
	}
	for w := range 8 {
		wg.Go(func() { // a publisher
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ctx.Err() == nil && i < 300; i++ {
				m := msg([]string{"x", "y"}[r.IntN(2)], base+r.Int64N(4*hour), uint8(r.IntN(4)), "b")
				m.MessageID = fmt.Sprint(r.IntN(20))
				if d, ok := h.s.Exchange(m.VHost, m.Exchange); ok {
					m.Incarnation = d.Incarnation
				}
				report(h.s.Put(ctx, m))
			}
		})
	}
	wg.Go(func() { // the scheduler
		for now := base; now < base+4*hour && ctx.Err() == nil; now += 10 * minute {
			var keys []store.Key
			report(h.s.ScanKeys(now, now+10*minute, func(k store.Key) error { keys = append(keys, k); return nil }))
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
	})
	wg.Go(func() { // the admin API and the status page
		r := rand.New(rand.NewPCG(9, 9))
		for i := 0; i < 50 && ctx.Err() == nil; i++ {
			_, err := h.s.Cancel(ctx, "/", "x", fmt.Sprint(r.IntN(20)))
			report(err)
			_, err = h.s.List("/", "y", store.Key{}, 20, false)
			report(err)
			h.s.Counts()
			h.s.Pending()
			h.s.Upcoming([]int64{base, base + hour})
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
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h.check()
}
