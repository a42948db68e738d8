package boltstore

import (
	"errors"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// Errors of Open, besides the contract's (package store). Callers match
// them with errors.Is.
var (
	// ErrNotStore: the file exists but is not a delayproxy store.
	ErrNotStore = errors.New("store: not a delayproxy store")
	// ErrSchemaTooNew: the file was written by a newer delayproxy.
	ErrSchemaTooNew = errors.New("store: schema version is newer than this delayproxy")
	// ErrLocked: another process holds the store file open.
	ErrLocked = errors.New("store: file is locked by another process")
)

// Options tune the bbolt file. The zero value is a good default.
//
// SlotWidth and FarWidth shape the file: they are recorded when the store is
// created and the recorded values win when it is opened again.
type Options struct {
	SlotWidth       time.Duration // width of a time slot bucket; default 1s
	NoSync          bool          // skip fsync (tests and benchmarks only)
	InitialMmapSize int           // bytes; default 1 GiB
	MaxBatch        int           // most messages in one group commit; default 10000

	// FarWidth is the width of a far bucket: messages due at or after the
	// cascade watermark are appended to the far bucket of their due time and
	// sorted into slots when the watermark passes them. Default 24h; a
	// multiple of SlotWidth. Wider: fewer pages written per commit when
	// delays spread over hours; narrower: shorter cascade scans.
	FarWidth time.Duration
	// CascadeLead is how far beyond the end of a Scan or ScanKeys range the
	// watermark is moved when it has to move. Default 1m.
	CascadeLead time.Duration
	// SyncFreelist writes bbolt's freelist at every commit instead of
	// rebuilding it with a page scan at Open (bbolt NoFreelistSync=false).
	SyncFreelist bool
	// MaxSize caps the file size in bytes (0: no cap). A commit that would
	// grow the file beyond it fails with ErrFull.
	MaxSize int
	// LockTimeout is how long Open waits for another process to release the
	// file lock before failing with ErrLocked. Default 1s.
	LockTimeout time.Duration
	// OnCommit, when set, is called by the writer goroutine after every
	// commit (for metrics: commit latency and batch size histograms). It must
	// return quickly and must not call the Store.
	OnCommit func(store.CommitInfo)
}

// Stats are cumulative counters of a Store since Open.
type Stats struct {
	Commits          uint64        // successful group commits
	FailedCommits    uint64        // commits that failed (every request in them failed)
	Requests         uint64        // write requests served by successful commits
	Messages         uint64        // messages written by Put
	Deletes          uint64        // messages removed
	MaxBatch         int           // most messages+deletes seen in one commit
	CommitTime       time.Duration // total time spent in group commits, fsync included
	Cascades         uint64        // cascade passes (far buckets sorted into slots)
	CascadedMessages uint64        // messages moved by cascade passes
	CascadeTime      time.Duration // total time spent in cascade passes
	Stale            int64         // stored messages of deleted or cancelled exchange incarnations
	PageWrites       uint64        // pages bbolt wrote (commits and cascades): write amplification
}
