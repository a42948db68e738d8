package store

import "context"

// Store is the durable half of the delay engine: delayed messages in release
// order, the registry of delayed exchanges, and exact counts. Every method is
// safe for concurrent use. Due times are unix milliseconds taken as given:
// the wall clock is the caller's business.
//
// A message is pending from the Put that stored it until a Delete, a cancel
// or the removal of its exchange's incarnation; a message is stale when the
// exchange it was stored for was deleted or cancelled since (Stale): it stays
// stored, is never released, and the scheduler deletes it at its turn.
// Counts of pending messages (Pending, Count, Counts) leave stale messages
// out; reads of stored messages (Get, ScanKeys, NextDue, Upcoming) include
// them.
//
// Durability: a write method (Put, Delete, the cancels, PutExchange,
// DeleteExchange) returns nil only once its change is durable; any error but
// the context's means nothing of the call was written; when the context ends
// first the method returns ctx.Err() and the change may or may not have been
// made. After Close every method that can fail returns ErrClosed.
type Store interface {
	// Put stores msgs durably, all or none. The caller sets each message's
	// Incarnation from the ExchangeDef it looked up for VHost and Exchange;
	// Put fails with ErrUnknownExchange, storing nothing, when that is not
	// the exchange's live incarnation (the exchange was deleted or
	// re-created meanwhile). A message whose exchange is deleted or
	// cancelled after that check but before the commit is stored stale.
	// A due time before 0 or beyond the implementation's range fails with
	// ErrInvalidMessage. Put sets each Key (from Due, Priority and a new
	// store-wide sequence, so later Puts order after earlier ones among
	// equal due and priority); the caller must not touch msgs until Put
	// returns.
	Put(ctx context.Context, msgs ...*Message) error
	// PutAsync is Put in two steps: it queues msgs for a group commit and
	// returns, and wait returns what Put would once they are durable (or
	// ctx ended). Calls made one after another queue in that order, so
	// their messages take sequences in that order: one goroutine may have
	// several PutAsync in flight and keep publish order. Keys are set by
	// the time wait returns; the caller must not touch msgs before.
	PutAsync(ctx context.Context, msgs ...*Message) (wait func() error)
	// Get reads messages by key: one result per key, nil for a key that is
	// not stored (deleted, cancelled, never stored). Stale messages are
	// returned; the caller asks Stale.
	Get(keys []Key) ([]*Message, error)
	// Delete removes the messages with these keys, once RabbitMQ confirmed
	// their release (or they were stale). A key not stored is no error.
	Delete(ctx context.Context, keys ...Key) error
	// ScanKeys calls fn with the key of every stored message due in
	// [from, until), stale ones included, in release order: due time, then
	// higher priority, then publish order. It stops at fn's first error and
	// returns it, except ErrStop, which ends the scan with nil. It serves the
	// scheduler's horizon and may cost work proportional to the range
	// (boltstore sorts far buckets into slots): not for far-future ranges,
	// which List serves. fn runs inside a read of the store and must not
	// call its write methods.
	ScanKeys(from, until int64, fn func(Key) error) error
	// NextDue is the due time of the earliest stored message, stale ones
	// included; false when nothing is stored or the store is closed.
	NextDue() (due int64, ok bool)
	// Stale reports whether m was stored for an incarnation of its exchange
	// that is no longer live (deleted or cancelled since).
	Stale(m *Message) bool

	// PutExchange records a delayed exchange durably. A new exchange gets a
	// fresh incarnation, never used before in this store; one already
	// registered keeps its incarnation and takes the other fields of def.
	// def.Incarnation is set on success.
	PutExchange(ctx context.Context, def *ExchangeDef) error
	// DeleteExchange removes an exchange from the registry and returns how
	// many messages were pending for it: they become stale. An exchange not
	// registered fails with ErrUnknownExchange.
	DeleteExchange(ctx context.Context, vhost, name string) (pending int64, err error)
	// Exchange looks a delayed exchange up, from memory. The returned
	// definition shares its Arguments with the registry: read-only.
	Exchange(vhost, name string) (ExchangeDef, bool)
	// Exchanges lists the registered exchanges in no particular order;
	// their Arguments are shared with the registry, as Exchange's.
	Exchanges() []ExchangeDef

	// Pending is the number of pending (not stale) messages, in O(1).
	Pending() int64
	// Count is the number of pending messages of one exchange, in O(1); 0
	// for an exchange not registered.
	Count(vhost, exchange string) int64
	// Counts lists every registered exchange with its pending count, sorted
	// by vhost, then name. Pending is exact. NextDue is the due time of the
	// exchange's earliest pending message, or 0 when none is pending or the
	// implementation's bounded search did not reach it.
	Counts() []ExchangeCount
	// Upcoming counts the stored messages (stale ones included, until they
	// are deleted at their turn) by due time in consecutive ranges, at the
	// cost of the time span they cover, not of their number. bounds are
	// ascending unix ms; the result has len(bounds)+1 counts: before
	// bounds[0], then [bounds[i-1], bounds[i]) for each i, then at or after
	// the last bound. A message counts by its due time rounded down to a
	// whole minute (a multiple of 60000 ms), so the counts are exact for
	// bounds that are whole minutes. They sum to the stored messages:
	// Pending plus the stale ones.
	Upcoming(bounds []int64) []int64

	// List returns up to limit pending messages of one exchange after the
	// key after (the zero Key starts at the beginning), in release order,
	// for paging: pass the last key of a page to get the next one. limit
	// <= 0 means 100 and at most 10000 are returned. Without withBody the
	// messages come without Body. An exchange not registered fails with
	// ErrUnknownExchange.
	List(vhost, exchange string, after Key, limit int, withBody bool) ([]*Message, error)
	// Cancel removes every stored message of the exchange with that
	// message-id, stale ones included, and returns the keys of those that
	// were pending, so that the caller can drop them from the scheduler's
	// wheel (the scheduler finds the stale ones gone at their turn). An
	// unknown id, or an exchange not registered, is no error.
	Cancel(ctx context.Context, vhost, exchange, messageID string) ([]Key, error)
	// CancelKey removes one message, stale or not, and reports whether it
	// was pending.
	CancelKey(ctx context.Context, key Key) (bool, error)
	// CancelExchange discards every pending message of an exchange and
	// keeps the exchange, in O(1): the exchange gets a new incarnation, its
	// messages become stale, and the scheduler deletes them at their turn
	// instead of releasing them. It returns how many were pending; an
	// exchange not registered fails with ErrUnknownExchange.
	CancelExchange(ctx context.Context, vhost, exchange string) (int64, error)

	// Close finishes the writes already accepted, makes everything durable
	// and releases the store. Calls after the first return ErrClosed.
	Close() error
}
