package testlog

import (
	"bytes"
	"log/slog"
	"os"
	"sync"
	"testing"
)

// For is New for the code one test runs: unless DELAYPROXY_TEST_LOG is
// set, it keeps the warnings and errors and writes them to t's log when t
// has failed, so that a failure seen once in CI comes with what the code
// under test reported.
func For(t testing.TB) *slog.Logger {
	if os.Getenv("DELAYPROXY_TEST_LOG") != "" {
		return New()
	}
	k := &kept{}
	t.Cleanup(func() {
		if t.Failed() {
			k.mu.Lock()
			defer k.mu.Unlock()
			if k.buf.Len() > 0 {
				t.Logf("warnings and errors logged by the code under test:\n%s", k.buf.Bytes())
			}
		}
	})
	return slog.New(slog.NewTextHandler(k, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// kept is the lines For keeps.
type kept struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

// maxKept bounds what For keeps of a long test's log.
const maxKept = 64 << 10

func (k *kept) Write(p []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.buf.Len() < maxKept {
		k.buf.Write(p)
	}
	return len(p), nil
}
