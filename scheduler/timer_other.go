//go:build !linux

package scheduler

import "time"

// newRealTimer returns a Go timer: timerfdTimer is Linux's.
func newRealTimer(d time.Duration) Timer { return goTimer{time.NewTimer(d)} }
