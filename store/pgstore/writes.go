package pgstore

import (
	"context"
	"fmt"

	"github.com/delayproxy/delayproxy/store"
)

// maxDue bounds due times as boltstore does (year ~146 million).
const maxDue = int64(1) << 62

// Put stores msgs in the next group commit; see store.Store.
func (s *Store) Put(ctx context.Context, msgs ...*store.Message) error {
	return s.PutAsync(ctx, msgs...)()
}

// PutAsync implements store.Store: the request is queued to the writer,
// which gives sequences in queue order, before it returns.
func (s *Store) PutAsync(ctx context.Context, msgs ...*store.Message) (wait func() error) {
	for _, m := range msgs {
		if m.Due < 0 || m.Due > maxDue {
			err := fmt.Errorf("%w: due time %d ms out of range", store.ErrInvalidMessage, m.Due)
			return func() error { return err }
		}
	}
	if len(msgs) == 0 {
		return func() error { return nil }
	}
	r := &request{kind: opPut, msgs: msgs}
	if err := s.enqueue(ctx, r); err != nil {
		return func() error { return err }
	}
	return func() error { return s.await(ctx, r) }
}

// Delete removes keys in the next group commit; see store.Store.
func (s *Store) Delete(ctx context.Context, keys ...store.Key) error {
	if len(keys) == 0 {
		if s.isClosed() {
			return store.ErrClosed
		}
		return nil
	}
	return s.submit(ctx, &request{kind: opDelete, keys: keys})
}

// Cancel removes the messages of one exchange with that message-id; see
// store.Store.
func (s *Store) Cancel(ctx context.Context, vhost, exchange, messageID string) ([]store.Key, error) {
	r := &request{kind: opCancelID, vhost: vhost, exchange: exchange, id: messageID}
	if err := s.submit(ctx, r); err != nil {
		return nil, err
	}
	return r.cancelled, nil
}

// CancelKey removes one message; see store.Store.
func (s *Store) CancelKey(ctx context.Context, key store.Key) (bool, error) {
	r := &request{kind: opCancelKey, keys: []store.Key{key}}
	if err := s.submit(ctx, r); err != nil {
		return false, err
	}
	return len(r.cancelled) > 0, nil
}
