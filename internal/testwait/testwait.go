// Package testwait waits in tests for what happens in other goroutines or
// processes: a condition polled until it holds or a deadline passes.
package testwait

import (
	"testing"
	"time"
)

// poll is how often Until asks again.
const poll = 5 * time.Millisecond

// Until fails the test unless f reports true before d has passed; what
// names the awaited condition in the failure.
func Until(t testing.TB, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(poll)
	}
}
