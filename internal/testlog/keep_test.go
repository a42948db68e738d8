package testlog

import (
	"fmt"
	"strings"
	"testing"
)

// recordingT is a testing.TB whose failure, cleanups and log are the
// test's to set and read.
type recordingT struct {
	testing.TB
	failed   bool
	cleanups []func()
	logged   []string
}

func (r *recordingT) Failed() bool     { return r.failed }
func (r *recordingT) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recordingT) Logf(format string, args ...any) {
	r.logged = append(r.logged, fmt.Sprintf(format, args...))
}
func (r *recordingT) finish() {
	for _, f := range r.cleanups {
		f()
	}
}

func TestForKeepsWarningsForAFailedTest(t *testing.T) {
	t.Setenv("DELAYPROXY_TEST_LOG", "")
	tests := []struct {
		name   string
		failed bool
		want   bool // the warning is in the test's log
	}{
		{"passed", false, false},
		{"failed", true, true},
	}
	for _, tt := range tests {
		r := &recordingT{TB: t, failed: tt.failed}
		log := For(r)
		log.Info("routine")
		log.Warn("releases not confirmed", "messages", 3)
		r.finish()
		all := strings.Join(r.logged, "\n")
		if got := strings.Contains(all, "releases not confirmed"); got != tt.want {
			t.Errorf("%s: warning in the log %v, want %v (log %q)", tt.name, got, tt.want, all)
		}
		if strings.Contains(all, "routine") {
			t.Errorf("%s: an info line was kept", tt.name)
		}
	}
}
