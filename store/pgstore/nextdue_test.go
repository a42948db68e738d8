package pgstore_test

import (
	"testing"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// TestNextDueFailedRead: a read that fails is not an empty store
// (store.Store): NextDue reports something may be due from the start, so
// that a scheduler scans (and meets the error) instead of skipping ahead.
func TestNextDueFailedRead(t *testing.T) {
	schema := teststore.PGSchema(t)
	s := teststore.OpenPG(t, schema, pgstore.Options{})
	if due, ok := s.NextDue(); ok {
		t.Fatalf("empty store: NextDue = %d, true", due)
	}
	exec(t, `ALTER TABLE "`+schema+`".messages RENAME TO messages_away`)
	due, ok := s.NextDue()
	exec(t, `ALTER TABLE "`+schema+`".messages_away RENAME TO messages`)
	if !ok || due != 0 {
		t.Fatalf("failed read: NextDue = %d, %v; want 0, true", due, ok)
	}
}
