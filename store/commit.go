package store

import "time"

// CommitInfo describes one group commit: what a store reports to its
// metrics after each commit.
type CommitInfo struct {
	Requests int           // Put/Delete/Cancel/... calls served by this commit
	Messages int           // messages written by Put
	Deletes  int           // keys removed (Delete, Cancel, CancelKey)
	Duration time.Duration // from transaction start to durable commit
	Err      error         // nil when the commit succeeded
}
