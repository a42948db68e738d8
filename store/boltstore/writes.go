package boltstore

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// Put stores msgs durably: it returns nil only after the commit holding
// them has been fsync'd (unless Options.NoSync). It sets each message's Key
// (from Due, Priority and a new sequence) and Incarnation (from the
// registry) before queueing; the caller must not touch msgs until Put
// returns. Concurrent Puts share commits: one writer goroutine commits
// together every request that arrived while the previous commit was in
// flight, and a caller waits only for the commit holding its messages.
//
// When ctx ends before the commit, Put returns ctx.Err() and says nothing
// about durability: the messages may or may not be stored. Any other error
// (unknown exchange, invalid message, disk full, I/O error, closed store)
// means none of msgs was stored.
func (s *Store) Put(ctx context.Context, msgs ...*store.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	items := make([]putItem, len(msgs))
	s.mu.RLock()
	for i, m := range msgs {
		d, ok := s.exchanges[exKey{m.VHost, m.Exchange}]
		if !ok {
			s.mu.RUnlock()
			return fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, m.Exchange, m.VHost)
		}
		items[i].inc = d.Incarnation
	}
	s.mu.RUnlock()
	for _, m := range msgs {
		if m.Due < 0 || m.Due >= maxDue {
			return fmt.Errorf("%w: due time %d ms out of range", store.ErrInvalidMessage, m.Due)
		}
	}
	seq := s.nextSeq.Add(uint64(len(msgs))) - uint64(len(msgs))
	for i, m := range msgs {
		m.Incarnation = items[i].inc
		m.Key = store.MakeKey(m.Due, m.Priority, seq+uint64(i))
		v := encodeMessage(m)
		if int64(len(v)) > bolt.MaxValueSize {
			return fmt.Errorf("%w: %d bytes encoded", store.ErrInvalidMessage, len(v))
		}
		items[i].key, items[i].val = m.Key, v
		if m.MessageID != "" {
			items[i].id = idKey([]byte(m.VHost), []byte(m.Exchange), []byte(m.MessageID), m.Key)
		}
	}
	return s.do(ctx, &request{kind: opPut, puts: items})
}

// Delete removes the messages with these keys in one group commit (the
// scheduler calls it once RabbitMQ confirmed their release). A missing key
// is not an error. A message in a slot is marked released, which rewrites
// no page of the slot; the slot goes with one DeleteBucket once all of it
// is released (see the package doc).
func (s *Store) Delete(ctx context.Context, keys ...store.Key) error {
	if len(keys) == 0 {
		return nil
	}
	return s.do(ctx, &request{kind: opDelete, keys: append([]store.Key(nil), keys...)})
}

// Cancel removes every stored message of the exchange with that message-id
// (found through the ids index) and returns how many of them were pending
// (stale ones are removed too but not counted).
func (s *Store) Cancel(ctx context.Context, vhost, exchange, messageID string) (int, error) {
	r := &request{kind: opCancelID, vhost: vhost, name: exchange, id: messageID}
	err := s.do(ctx, r)
	return int(r.n), err
}

// CancelKey removes one message and reports whether it was pending.
func (s *Store) CancelKey(ctx context.Context, key store.Key) (bool, error) {
	r := &request{kind: opCancelKey, keys: []store.Key{key}}
	err := s.do(ctx, r)
	return r.n > 0, err
}

// CancelExchange discards every pending message of an exchange and keeps the
// exchange: it gives the exchange a new incarnation, which makes the pending
// messages stale (see Stale) in O(1). It returns how many were pending.
func (s *Store) CancelExchange(ctx context.Context, vhost, exchange string) (int64, error) {
	r := &request{kind: opCancelExchange, vhost: vhost, name: exchange}
	err := s.do(ctx, r)
	return r.n, err
}

// PutExchange records a delayed exchange. A new exchange gets a fresh
// incarnation; an existing one keeps its incarnation and takes the other
// fields of def (the caller compares definitions before). def.Incarnation is
// set on success.
func (s *Store) PutExchange(ctx context.Context, def *store.ExchangeDef) error {
	r := &request{kind: opPutExchange, def: *def}
	r.def.Arguments = append([]byte(nil), def.Arguments...)
	if err := s.do(ctx, r); err != nil {
		return err
	}
	def.Incarnation = r.def.Incarnation
	return nil
}

// DeleteExchange removes an exchange from the registry. Its pending
// messages become stale and are discarded when the scheduler meets them. It
// returns how many were pending, or ErrUnknownExchange.
func (s *Store) DeleteExchange(ctx context.Context, vhost, name string) (int64, error) {
	r := &request{kind: opDeleteExchange, vhost: vhost, name: name}
	err := s.do(ctx, r)
	return r.n, err
}
