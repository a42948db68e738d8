package amqpproxy

import (
	"net"
	"testing"
	"time"
)

// TestReadTimerDeadlineBeforeEndsReadInProgress: a deadline moved earlier
// ends a Read already waiting on a later one (the idle timeout, or none).
func TestReadTimerDeadlineBeforeEndsReadInProgress(t *testing.T) {
	t.Parallel()
	for _, idle := range []time.Duration{0, time.Minute} {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		r := &readTimer{Conn: a}
		r.idle.Store(int64(idle))
		done := make(chan error, 1)
		go func() {
			_, err := r.Read(make([]byte, 1))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond) // let the Read start waiting (no event to await)
		r.setDeadlineBefore(time.Now().Add(50 * time.Millisecond))
		select {
		case err := <-done:
			if !isTimeout(err) {
				t.Errorf("idle %v: Read returned %v, want a timeout", idle, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("idle %v: Read still waiting 10s after its deadline was moved to 50ms", idle)
		}
	}
}
