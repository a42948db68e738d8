package bench

import (
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testload"
	"github.com/delayproxy/delayproxy/scheduler"
)

// BenchmarkClock_WakeLateness arms a timer b.N times for 0-3 ms ahead and
// reports how late it woke its owner (p50, p99, max), for the scheduler's
// RealClock timer and for a plain time.Timer: idle, and with the runtime's
// run queues kept busy by goroutines that never block in a system call (as
// in a proxy under heavy intake). Never early, both.
func BenchmarkClock_WakeLateness(b *testing.B) {
	timers := []struct {
		name  string
		sleep func() (until func(deadline time.Time) time.Time, stop func())
	}{
		{"realclock", func() (func(time.Time) time.Time, func()) {
			t := scheduler.RealClock{}.NewTimer(time.Hour)
			return func(deadline time.Time) time.Time { t.ResetAt(deadline); return <-t.C() }, t.Stop
		}},
		{"gotimer", func() (func(time.Time) time.Time, func()) {
			t := time.NewTimer(time.Hour)
			return func(deadline time.Time) time.Time { t.Reset(time.Until(deadline)); return <-t.C }, func() { t.Stop() }
		}},
	}
	for _, load := range []struct {
		name  string
		pairs int
	}{{"idle", 0}, {"busy", 3}} {
		for _, tt := range timers {
			b.Run(load.name+"/"+tt.name, func(b *testing.B) {
				steal := startSteal()
				defer steal.report(b)
				stopLoad := testload.BusyRunQueues(load.pairs)
				defer stopLoad()
				until, stop := tt.sleep()
				defer stop()
				late, err := testload.Oversleeps(b.N, 3*time.Millisecond, until)
				if err != nil {
					b.Fatal(err)
				}
				reportPercentiles(b, "late", late)
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
