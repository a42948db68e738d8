package boltstore

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// Put implements store.Store: it returns nil only after the commit holding
// msgs has been fsync'd (unless Options.NoSync). Its registry check is one
// lookup of each message's incarnation among the live ones, copying
// nothing. Concurrent Puts share commits: one writer goroutine commits
// together every request that arrived while the previous commit was in
// flight, and a caller waits only for the commit holding its messages. Due
// times must lie in [0, 2^62).
func (s *Store) Put(ctx context.Context, msgs ...*store.Message) error {
	return s.PutAsync(ctx, msgs...)()
}

// PutAsync implements store.Store: the messages take their sequences and
// their request is queued to the writer before it returns.
func (s *Store) PutAsync(ctx context.Context, msgs ...*store.Message) (wait func() error) {
	r, err := s.queuePut(ctx, msgs)
	switch {
	case err != nil:
		return func() error { return err }
	case r == nil:
		return func() error { return nil }
	}
	return func() error { return s.await(ctx, r) }
}

// queuePut checks msgs, gives them their keys and queues their request
// (nil when there are no messages).
func (s *Store) queuePut(ctx context.Context, msgs []*store.Message) (*request, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	liveInc := s.liveIncs()
	for _, m := range msgs {
		if k, ok := liveInc[m.Incarnation]; !ok || k.vhost != m.VHost || k.name != m.Exchange {
			return nil, fmt.Errorf("%w: %q in vhost %q (incarnation %d)", store.ErrUnknownExchange, m.Exchange, m.VHost, m.Incarnation)
		}
	}
	for _, m := range msgs {
		if m.Due < 0 || m.Due >= maxDue {
			return nil, fmt.Errorf("%w: due time %d ms out of range", store.ErrInvalidMessage, m.Due)
		}
	}
	r := &request{kind: opPut}
	items := r.one[:]
	if len(msgs) > 1 {
		items = make([]putItem, len(msgs))
	}
	seq := s.nextSeq.Add(uint64(len(msgs))) - uint64(len(msgs))
	for i, m := range msgs {
		items[i].inc = m.Incarnation
		m.Key = store.MakeKey(m.Due, m.Priority, seq+uint64(i))
		v := encodeMessage(m)
		if int64(len(v)) > bolt.MaxValueSize {
			return nil, fmt.Errorf("%w: %d bytes encoded", store.ErrInvalidMessage, len(v))
		}
		items[i].key, items[i].val = m.Key, v
		if m.MessageID != "" {
			items[i].id = idKey([]byte(m.VHost), []byte(m.Exchange), []byte(m.MessageID), m.Key)
		}
	}
	r.puts = items
	return r, s.enqueue(ctx, r)
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

// Cancel implements store.Store; it finds the messages through the ids
// index.
func (s *Store) Cancel(ctx context.Context, vhost, exchange, messageID string) ([]store.Key, error) {
	r := &request{kind: opCancelID, vhost: vhost, name: exchange, id: messageID}
	if err := s.do(ctx, r); err != nil {
		return nil, err
	}
	return r.removed, nil
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
	d := *def
	d.Arguments = append([]byte(nil), def.Arguments...)
	if err := s.do(ctx, &request{kind: opPutExchange, def: &d}); err != nil {
		return err
	}
	def.Incarnation = d.Incarnation
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
