package boltstore

import (
	"encoding/binary"
	"errors"
	"time"
)

// Sentinel errors returned by the store. Callers match them with errors.Is.
var (
	// ErrClosed: the store has been closed; nothing was written.
	ErrClosed = errors.New("store: closed")
	// ErrNotStore: the file exists but is not a delayproxy store.
	ErrNotStore = errors.New("store: not a delayproxy store")
	// ErrSchemaTooNew: the file was written by a newer delayproxy.
	ErrSchemaTooNew = errors.New("store: schema version is newer than this delayproxy")
	// ErrUnknownExchange: Put named an exchange that is not in the registry
	// (also returned by CancelExchange, DeleteExchange and List).
	ErrUnknownExchange = errors.New("store: exchange is not a registered delayed exchange")
	// ErrLocked: another process holds the store file open.
	ErrLocked = errors.New("store: file is locked by another process")
	// ErrFull: the file reached Options.MaxSize or the disk is full; nothing
	// of the failed commit was written.
	ErrFull = errors.New("store: no space left")
	// ErrInvalidMessage: Put was given a message that cannot be stored
	// (negative due time, value too large); nothing was written.
	ErrInvalidMessage = errors.New("store: invalid message")
	// ErrStop may be returned by a Scan or ScanKeys callback to end the scan
	// early; the scan then returns nil.
	ErrStop = errors.New("store: stop scan")
)

// KeySize is the length of a Key in bytes.
const KeySize = 17

// Key identifies a stored message and orders release:
//
//	 0               8      9              17
//	+---------------+------+---------------+
//	| due ms (BE)   | 255- | sequence (BE) |
//	| unix millis   | prio |               |
//	+---------------+------+---------------+
//
// Byte order is release order: earlier due first, then higher priority, then
// publish order.
type Key [KeySize]byte

// MakeKey builds the key of a message due at due (unix ms) with the given
// priority and sequence.
func MakeKey(due int64, priority uint8, seq uint64) Key {
	var k Key
	binary.BigEndian.PutUint64(k[0:8], uint64(due))
	k[8] = 255 - priority
	binary.BigEndian.PutUint64(k[9:17], seq)
	return k
}

// Due is the due time in unix milliseconds.
func (k Key) Due() int64 { return int64(binary.BigEndian.Uint64(k[0:8])) }

// Priority is the AMQP priority (0-255).
func (k Key) Priority() uint8 { return 255 - k[8] }

// Seq is the store-wide publish sequence.
func (k Key) Seq() uint64 { return binary.BigEndian.Uint64(k[9:17]) }

// CompareKeys orders keys in release order, as bytes.Compare orders their
// bytes (in three word compares): it sorts and searches slices of keys.
func CompareKeys(a, b Key) int {
	if x, y := binary.BigEndian.Uint64(a[0:8]), binary.BigEndian.Uint64(b[0:8]); x != y {
		if x < y {
			return -1
		}
		return 1
	}
	if a[8] != b[8] {
		if a[8] < b[8] {
			return -1
		}
		return 1
	}
	x, y := binary.BigEndian.Uint64(a[9:17]), binary.BigEndian.Uint64(b[9:17])
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Message is one delayed message as stored.
type Message struct {
	Key         Key    // assigned by Put from Due, Priority and a new sequence
	VHost       string // virtual host of the delayed exchange
	Exchange    string // name of the delayed exchange
	RoutingKey  string
	Mandatory   bool
	Properties  []byte // raw content-header property flags and list, byte-exact
	Body        []byte
	Due         int64  // unix milliseconds at which to release
	Delay       int64  // the x-delay asked for, ms (the release sets x-delay = -Delay)
	Priority    uint8  // AMQP priority property, 0 when absent
	MessageID   string // AMQP message-id property, "" when absent
	Incarnation uint64 // registry incarnation of the exchange; set by Put
}

// ExchangeDef is a delayed exchange as recorded in the registry.
type ExchangeDef struct {
	VHost       string
	Name        string
	DelayedType string // x-delayed-type: direct, topic, fanout, headers, ...
	Durable     bool
	AutoDelete  bool
	Internal    bool
	Arguments   []byte // raw AMQP field table as declared (x-delayed-type included)
	Incarnation uint64 // assigned by PutExchange; a re-created exchange gets a new one
}

// ExchangeCount is the number of pending messages of one delayed exchange.
type ExchangeCount struct {
	VHost    string
	Exchange string
	Pending  int64
	// NextDue is the unix ms of the earliest pending message; 0 when none is
	// pending or when it lies beyond the bounded scan of Counts.
	NextDue int64
}

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
	OnCommit func(CommitInfo)
}

// CommitInfo describes one group commit (see Options.OnCommit).
type CommitInfo struct {
	Requests int           // Put/Delete/Cancel/... calls served by this commit
	Messages int           // messages written by Put
	Deletes  int           // keys removed (Delete, Cancel, CancelKey)
	Duration time.Duration // from transaction start to fsync'd commit
	Err      error         // nil when the commit succeeded
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
