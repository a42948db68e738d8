package delayproxy

import (
	"context"

	"github.com/delayproxy/delayproxy/store"
)

// engine is what the admin API reads and cancels: the store, whose cancels
// also take the cancelled keys out of the scheduler's in-memory wheel at
// once, so a cancelled message is neither released nor held in memory.
//
// CancelExchange names no keys: the exchange's messages become stale in the
// store, and the scheduler discards the ones it already holds, unreleased,
// when their turn comes.
type engine struct {
	store.Store
	sched wheelCanceller
}

// wheelCanceller drops keys from the release schedule; *scheduler.Scheduler
// has it.
type wheelCanceller interface {
	Cancelled(keys ...store.Key)
}

// Cancel removes the exchange's pending messages with that message-id.
func (e engine) Cancel(ctx context.Context, vhost, exchange, messageID string) ([]store.Key, error) {
	keys, err := e.Store.Cancel(ctx, vhost, exchange, messageID)
	e.sched.Cancelled(keys...)
	return keys, err
}

// CancelKey removes one pending message.
func (e engine) CancelKey(ctx context.Context, key store.Key) (bool, error) {
	ok, err := e.Store.CancelKey(ctx, key)
	if ok {
		e.sched.Cancelled(key)
	}
	return ok, err
}
