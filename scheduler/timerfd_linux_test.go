package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testload"
)

func TestTimerfdTimer(t *testing.T) {
	tests := []struct {
		name    string
		first   time.Duration // NewTimer's d
		wait    time.Duration // before the re-arming, -1 for none
		reset   time.Duration // the re-arming, from its time
		wantGap time.Duration // the earliest fire, from the re-arming (or NewTimer)
	}{
		{"fires at its deadline", 3 * time.Millisecond, -1, 0, 3 * time.Millisecond},
		{"a deadline in the past fires at once", -time.Second, -1, 0, 0},
		{"re-armed later before firing", 2 * time.Millisecond, 0, 20 * time.Millisecond, 20 * time.Millisecond},
		// The first arming has expired (its value may be read or in
		// flight) when ResetAt moves the deadline on: that value must not
		// arrive.
		{"an expired arming is dropped", time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond},
		{"re-armed earlier", time.Hour, 0, 2 * time.Millisecond, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			tm := newRealTimer(tt.first)
			defer tm.Stop()
			if _, ok := tm.(*timerfdTimer); !ok {
				t.Fatalf("newRealTimer gave %T, want a timerfd", tm)
			}
			if tt.wait >= 0 {
				time.Sleep(tt.wait)
				start = time.Now()
				tm.ResetAt(start.Add(tt.reset))
			}
			at := awaitFire(t, tm)
			if gap := at.Sub(start); gap < tt.wantGap {
				t.Fatalf("fired %v after arming, want at least %v", gap, tt.wantGap)
			}
			if since := time.Since(start); since < tt.wantGap {
				t.Fatalf("received %v after arming, want at least %v", since, tt.wantGap)
			}
			expectSilent(t, tm, 30*time.Millisecond, "fired twice for one arming")
		})
	}
}

// TestTimerfdTimerStop checks that Stop ends the reading goroutine (goleak
// in TestMain fails the package otherwise), twice over, and that a stopped
// timer ignores ResetAt.
func TestTimerfdTimerStop(t *testing.T) {
	tm := newRealTimer(time.Hour)
	tm.Stop()
	tm.ResetAt(time.Now())
	tm.Stop()
	expectSilent(t, tm, 20*time.Millisecond, "a stopped timer fired")
}

// TestTimerfdTimerMovedOn re-arms the timer later, turn after turn, as the
// scheduler's loop does while Puts keep waking it: the fd, armed for the
// first deadline, expires before the last one and must be re-armed for it.
func TestTimerfdTimerMovedOn(t *testing.T) {
	tm := newRealTimer(time.Millisecond)
	defer tm.Stop()
	var last time.Time
	for range 40 {
		last = time.Now().Add(5 * time.Millisecond)
		tm.ResetAt(last)
		time.Sleep(200 * time.Microsecond)
	}
	if at := awaitFire(t, tm); at.Before(last) || time.Now().Before(last) {
		t.Fatalf("fired %v before the last deadline", last.Sub(at))
	}
}

// TestTimerfdTimerBusyRuntime arms the timer again and again while the
// runtime's run queues never empty, so the netpoller that reports the fd's
// expiry is polled only every 10 ms or so: the Go timer beside the fd must
// wake the owner at the next scheduling point, never early. The fd alone
// took a median of 34 ms past the deadline here; the bound leaves room for
// a slow machine, far below that.
func TestTimerfdTimerBusyRuntime(t *testing.T) {
	stop := testload.BusyRunQueues(3)
	defer stop()
	tm := newRealTimer(time.Hour)
	defer tm.Stop()
	late, err := testload.Oversleeps(200, 2*time.Millisecond, func(deadline time.Time) time.Time {
		tm.ResetAt(deadline)
		return awaitFire(t, tm)
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(late)
	if median := late[len(late)/2]; median > 5*time.Millisecond {
		t.Fatalf("median wake-up %v past the deadline while the run queues were busy, want at most 5ms", median)
	}
}

// awaitFire returns the value tm sends, failing the test after 10 s.
func awaitFire(t *testing.T, tm Timer) time.Time {
	t.Helper()
	select {
	case at := <-tm.C():
		return at
	case <-time.After(10 * time.Second):
		t.Fatal("did not fire")
		return time.Time{}
	}
}

// expectSilent fails the test with msg if tm sends within d.
func expectSilent(t *testing.T, tm Timer, d time.Duration, msg string) {
	t.Helper()
	select {
	case <-tm.C():
		t.Fatal(msg)
	case <-time.After(d):
	}
}
