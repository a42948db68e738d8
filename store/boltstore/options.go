package boltstore

import (
	"fmt"
	"log/slog"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// Defaults of Options.
const (
	defaultSlotWidth   = time.Second
	defaultFarWidth    = 24 * time.Hour
	defaultCascadeLead = time.Minute
	defaultMmapSize    = 1 << 30
	defaultMaxBatch    = 10000
	defaultLockTimeout = time.Second
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
	// CascadeLead is how far beyond the end of a ScanKeys range the
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
	// Metrics, when set, hears of every group commit (commit latency and
	// batch size histograms); *metrics.Metrics is one.
	Metrics Metrics
	// Logger reports what Open recovers from or works around (no room on
	// the disk for the journal); nil: slog.Default().
	Logger *slog.Logger
}

// Metrics is what the store reports to. Commit is called by the writer
// goroutine or its background checkpoint after every commit: it must
// return quickly and must not call the Store.
type Metrics interface {
	Commit(store.CommitInfo)
}

func (o Options) normalize() (Options, error) {
	if o.SlotWidth == 0 {
		o.SlotWidth = defaultSlotWidth
	}
	if o.FarWidth == 0 {
		o.FarWidth = defaultFarWidth
	}
	if o.CascadeLead == 0 {
		o.CascadeLead = defaultCascadeLead
	}
	if o.InitialMmapSize == 0 {
		o.InitialMmapSize = defaultMmapSize
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = defaultLockTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.SlotWidth < time.Millisecond || o.SlotWidth%time.Millisecond != 0:
		return o, fmt.Errorf("store: SlotWidth %v is not a whole number of milliseconds", o.SlotWidth)
	case o.FarWidth < o.SlotWidth || o.FarWidth%o.SlotWidth != 0:
		return o, fmt.Errorf("store: FarWidth %v is not a multiple of SlotWidth %v", o.FarWidth, o.SlotWidth)
	case o.CascadeLead < 0:
		return o, fmt.Errorf("store: negative CascadeLead %v", o.CascadeLead)
	}
	return o, nil
}

func boltOptions(o Options) *bolt.Options {
	return &bolt.Options{
		Timeout:         o.LockTimeout,
		NoFreelistSync:  !o.SyncFreelist,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: o.InitialMmapSize,
		NoSync:          o.NoSync,
		MaxSize:         o.MaxSize,
	}
}
