package scheduler

import (
	"testing"
	"time"
)

func TestManualTimerResetAt(t *testing.T) {
	tests := []struct {
		name    string
		advance time.Duration // between reading the clock and arming
		at      time.Duration // the arming, after the reading
		fired   bool          // at once
	}{
		// The loop reads the clock, the clock moves past the wake-up it
		// computed, then it arms: the timer must fire at once, not 50 ms
		// after the move (the cause of a rare stuck test).
		{"clock moved past the deadline", 100 * time.Millisecond, 50 * time.Millisecond, true},
		{"clock moved to the deadline", 50 * time.Millisecond, 50 * time.Millisecond, true},
		{"deadline still ahead", 10 * time.Millisecond, 50 * time.Millisecond, false},
		{"deadline in the past", 0, -time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := NewManualClock(base)
			tm := clk.NewTimer(time.Hour)
			read := clk.Now()
			clk.Advance(tt.advance)
			tm.ResetAt(read.Add(tt.at))
			select {
			case <-tm.C():
				if !tt.fired {
					t.Fatal("fired before its deadline")
				}
			default:
				if tt.fired {
					t.Fatal("did not fire though the clock is past its deadline")
				}
				clk.Advance(tt.at - tt.advance)
				select {
				case <-tm.C():
				default:
					t.Fatal("did not fire when the clock reached its deadline")
				}
			}
		})
	}
}
