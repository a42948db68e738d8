package boltstore

import (
	"bytes"
	"context"

	"github.com/delayproxy/delayproxy/store"
)

// checkpoint commits the journaled messages to bbolt when there are any
// (or an append failed since the last checkpoint); the writer runs it
// before a Check and when it exits, and reads ask for it (opCheckpoint).
func (s *Store) checkpoint() error {
	if s.jr == nil || (len(s.ov.items) == 0 && !s.journalFailed) {
		return nil
	}
	r := &request{kind: opCheckpoint, ctx: context.Background(), done: make(chan struct{})}
	s.commit([]*request{r})
	return r.err
}

// checkpoint writes the journaled messages (the overlay) into the batch
// and moves the journal to its next generation with it, when there are
// any or an append failed since the last checkpoint (its record must
// never be replayed).
func (b *batch) checkpoint() error {
	s := b.s
	if s.jr == nil || (len(s.ov.items) == 0 && !s.journalFailed) {
		return nil
	}
	b.journaled = len(s.ov.items)
	b.journalGen = s.jr.gen + 1
	for i := range s.ov.items {
		if err := b.put(&s.ov.items[i]); err != nil {
			return err
		}
	}
	return nil
}

// independent reports whether r touches no journaled message, so that it
// may be committed while they stay out of bbolt (see commitGroup).
func (s *Store) independent(r *request) bool {
	switch r.kind {
	case opPut, opPutExchange:
		return true
	case opDelete, opCancelKey:
		for _, k := range r.keys {
			if s.ov.get(k) != nil {
				return false
			}
		}
		return true
	case opCancelID:
		prefix := idPrefix(0, []byte(r.vhost), []byte(r.name), []byte(r.id))[idEpochSize:]
		for i := range s.ov.items {
			id := s.ov.items[i].id
			if len(id) == idEpochSize+len(prefix)+store.KeySize && bytes.HasPrefix(id[idEpochSize:], prefix) {
				return false
			}
		}
		return true
	case opCancelExchange, opDeleteExchange:
		d, ok := s.exchanges[exKey{r.vhost, r.name}]
		return !ok || s.ov.counts[d.Incarnation] == 0
	}
	return false // opCheckpoint: it asked for the journal
}
