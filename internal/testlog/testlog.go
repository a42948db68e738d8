// Package testlog is the logger of the code under test: silent unless
// DELAYPROXY_TEST_LOG is set, then every level to standard error; For
// keeps a test's warnings and errors for its log if it fails.
package testlog

import (
	"io"
	"log/slog"
	"os"
)

// New returns a logger that discards everything unless DELAYPROXY_TEST_LOG
// is set; then it writes text at debug level and above to standard error.
func New() *slog.Logger {
	if os.Getenv("DELAYPROXY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
