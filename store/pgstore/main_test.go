package pgstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every store closed by its test leaves no goroutine behind: the writer,
// the committers, the listener and pgx's pool all end with Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
