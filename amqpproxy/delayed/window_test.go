package delayed

import (
	"testing"
	"time"
)

func TestWindowDue(t *testing.T) {
	tests := []struct {
		due    int64
		window time.Duration
		want   int64
	}{
		{1_000_001, 0, 1_000_001},
		{1_000_001, time.Millisecond, 1_000_001},
		{1_000_000, 10 * time.Millisecond, 1_000_000}, // on a boundary: unchanged
		{1_000_001, 10 * time.Millisecond, 1_000_010},
		{1_000_009, 10 * time.Millisecond, 1_000_010},
		{1_000_010, 10 * time.Millisecond, 1_000_010},
		{1_000_011, 10 * time.Millisecond, 1_000_020},
		{1_700_000_000_123, time.Second, 1_700_000_001_000},
		{1_700_000_000_123, time.Hour, 1_700_002_800_000},
	}
	for _, tt := range tests {
		got := windowDue(tt.due, tt.window)
		if got != tt.want {
			t.Errorf("windowDue(%d, %v) = %d, want %d", tt.due, tt.window, got, tt.want)
		}
		if got < tt.due {
			t.Errorf("windowDue(%d, %v) = %d: earlier than the due time", tt.due, tt.window, got)
		}
	}
}
