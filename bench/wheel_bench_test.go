package bench

import (
	"math/rand/v2"
	"testing"

	"github.com/delayproxy/delayproxy/scheduler"
	"github.com/delayproxy/delayproxy/store"
)

// BenchmarkWheel_AddExpire measures the wheel in steady state: a one-minute
// horizon holding about a million keys, 16 new keys per millisecond at random
// delays within the horizon, and the clock advancing 1 ms every 16 adds with
// an Expire. ops/s counts every Add and every key Expire returned.
func BenchmarkWheel_AddExpire(b *testing.B) {
	const (
		horizon = 60_000 // ms
		perMs   = 16
		start   = int64(1_700_000_000_000)
	)
	r := rand.New(rand.NewPCG(1, 2))
	offs := make([]int64, 1<<16)
	prios := make([]uint8, len(offs))
	for i := range offs {
		offs[i] = 1 + r.Int64N(horizon-1)
		prios[i] = uint8(r.IntN(4))
	}
	w := scheduler.NewWheel(start, horizon)
	now := start
	seq := uint64(0)
	var dst []store.Key
	// Fill the horizon, so the measured part runs at a steady size.
	for range horizon * perMs {
		seq++
		w.Add(store.MakeKey(now+offs[seq%uint64(len(offs))], prios[seq%uint64(len(prios))], seq))
		if seq%perMs == 0 {
			now++
			dst = w.Expire(now, dst[:0])
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	expired := 0
	for i := 0; i < b.N; i++ {
		seq++
		w.Add(store.MakeKey(now+offs[seq%uint64(len(offs))], prios[seq%uint64(len(prios))], seq))
		if seq%perMs == 0 {
			now++
			dst = w.Expire(now, dst[:0])
			expired += len(dst)
		}
	}
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N+expired)/secs, "ops/s")
	b.ReportMetric(float64(w.Len()), "keys-held")
}
