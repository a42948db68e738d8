package store

import (
	"context"
	"errors"
)

// errNotImplemented is temporary while the store is being written.
var errNotImplemented = errors.New("store: not implemented yet")

// ErrStop may be returned by a Scan, ScanKeys callback to stop early; the
// scan then returns nil.
var ErrStop = errors.New("store: stop scan")

// Stats are cumulative counters of the group-commit writer.
type Stats struct {
	Commits       uint64 // committed write transactions
	Messages      uint64 // messages written by Put
	Deletes       uint64 // keys removed by Delete
	Requests      uint64 // Put/Delete requests served
	FailedCommits uint64 // commits that returned an error
	CommitNanos   uint64 // total time spent in commits (including fsync)
}

// Store is a durable timing wheel of delayed messages in a bbolt file.
type Store struct{}

// Open creates or opens the store at path.
func Open(path string, opts Options) (*Store, error) { return nil, errNotImplemented }

// Close waits for in-flight commits and closes the file.
func (s *Store) Close() error { return errNotImplemented }

// Put stores msgs durably.
func (s *Store) Put(ctx context.Context, msgs ...*Message) error { return errNotImplemented }

// Delete removes keys.
func (s *Store) Delete(ctx context.Context, keys ...Key) error { return errNotImplemented }

// Get reads messages by key.
func (s *Store) Get(keys []Key) ([]*Message, error) { return nil, errNotImplemented }

// Scan calls fn for each message due in [from, until) in release order.
func (s *Store) Scan(from, until int64, fn func(*Message) error) error { return errNotImplemented }

// ScanKeys calls fn for each key due in [from, until) in release order.
func (s *Store) ScanKeys(from, until int64, fn func(Key) error) error { return errNotImplemented }

// NextDue is the earliest pending due time.
func (s *Store) NextDue() (int64, bool) { return 0, false }

// Stale reports whether m's exchange was deleted or cancelled since m was stored.
func (s *Store) Stale(m *Message) bool { return false }

// Cancel deletes all pending messages with that message-id.
func (s *Store) Cancel(ctx context.Context, vhost, exchange, messageID string) (int, error) {
	return 0, errNotImplemented
}

// CancelKey deletes one pending message.
func (s *Store) CancelKey(ctx context.Context, key Key) (bool, error) {
	return false, errNotImplemented
}

// CancelExchange discards all pending messages of an exchange.
func (s *Store) CancelExchange(ctx context.Context, vhost, exchange string) (int64, error) {
	return 0, errNotImplemented
}

// PutExchange records a delayed exchange.
func (s *Store) PutExchange(ctx context.Context, def *ExchangeDef) error { return errNotImplemented }

// Exchange looks up a delayed exchange.
func (s *Store) Exchange(vhost, name string) (ExchangeDef, bool) { return ExchangeDef{}, false }

// Exchanges lists the delayed exchanges.
func (s *Store) Exchanges() []ExchangeDef { return nil }

// DeleteExchange removes a delayed exchange.
func (s *Store) DeleteExchange(ctx context.Context, vhost, name string) (int64, error) {
	return 0, errNotImplemented
}

// Pending is the number of pending messages.
func (s *Store) Pending() int64 { return 0 }

// Count is the number of pending messages of one exchange.
func (s *Store) Count(vhost, exchange string) int64 { return 0 }

// Counts lists pending counts per exchange.
func (s *Store) Counts() []ExchangeCount { return nil }

// List pages through the pending messages of one exchange.
func (s *Store) List(vhost, exchange string, after Key, limit int, withBody bool) ([]*Message, error) {
	return nil, errNotImplemented
}

// Check verifies the file and the counters.
func (s *Store) Check() error { return errNotImplemented }

// Stats returns cumulative writer statistics.
func (s *Store) Stats() Stats { return Stats{} }
