package boltstore

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// checkpointAt is how many messages the active layer holds before the
// writer checkpoints it in the background; the rest, up to
// journalMaxMessages, is room for appends while a checkpoint runs.
const checkpointAt = journalMaxMessages * 3 / 4

// idleCheckpointAfter is how long the writer waits without a request
// before it checkpoints what is journaled in the background: after a burst
// of Puts, so that the first Delete, or a read that walks bbolt, does not
// wait for the burst's tail to go into bbolt.
const idleCheckpointAfter = 50 * time.Millisecond

// checkpoint commits the journaled messages to bbolt when there are any
// (or an append failed since the last checkpoint), once the background
// checkpoint, if one runs, has ended. The writer runs it before a Check
// and when it exits, and reads ask for it (opCheckpoint).
func (s *Store) checkpoint() error {
	s.awaitCheckpoint()
	if !s.journalPending() {
		return nil
	}
	r := &request{kind: opCheckpoint, ctx: context.Background(), done: make(chan struct{})}
	s.commit([]*request{r})
	return r.err
}

// checkpoint writes every journaled message into the batch (the frozen
// layer first: one is left only by a background checkpoint that failed)
// and moves the journal to its next generation with it, when there are
// any or an append failed since the last checkpoint (its record must
// never be replayed).
func (b *batch) checkpoint() error {
	s := b.s
	if !s.journalPending() {
		return nil
	}
	return b.putJournaled(s.ov.items(), s.ov.len(), s.jr.gen+1)
}

// journalPending reports whether a checkpoint has work: journaled
// messages, or a failed append whose generation must be left behind.
func (s *Store) journalPending() bool {
	return s.jr != nil && (s.ov.len() > 0 || s.journalFailed)
}

// putJournaled writes n journaled messages into the batch and makes next
// the journal's next generation once the batch commits.
func (b *batch) putJournaled(items iter.Seq[*putItem], n int, next uint64) error {
	b.journaled, b.journalGen = n, next
	for p := range items {
		if err := b.put(p); err != nil {
			return err
		}
	}
	return nil
}

// maybeCheckpoint starts a background checkpoint when the active layer
// holds checkpointAt messages and none runs.
func (s *Store) maybeCheckpoint() {
	if s.canCheckpointInBackground() && len(s.ov.active.items) >= checkpointAt {
		s.startCheckpoint()
	}
}

// canCheckpointInBackground reports whether a background checkpoint may
// start: none runs, none failed (a failed one leaves its frozen layer to
// the writer's next commit), and bbolt was not found full.
func (s *Store) canCheckpointInBackground() bool {
	return s.ckDone == nil && !s.checkpointFull && len(s.ov.frozen.items) == 0
}

// startCheckpoint freezes the active layer and writes it into bbolt in a
// goroutine of its own, while the journal takes the next generation in its
// other file. Until awaitCheckpoint takes its outcome the writer only
// appends to the journal: the checkpoint's transaction and applyCommitted
// use the writer's state (watermark, counters, slot counts, cascade scan).
func (s *Store) startCheckpoint() {
	next := s.jr.gen + 1
	s.mu.Lock()
	s.ov.freeze()
	s.mu.Unlock()
	s.jr.restart(next)
	done := make(chan error, 1)
	s.ckDone = done
	go func() { done <- s.checkpointFrozen(next) }()
}

// awaitCheckpoint waits for the background checkpoint, if one runs.
func (s *Store) awaitCheckpoint() {
	if s.ckDone != nil {
		s.checkpointEnded(<-s.ckDone)
	}
}

// checkpointEnded takes the outcome of the background checkpoint. After a
// failure the frozen layer stays, and the next commit writes it with the
// active one; without room in bbolt (ErrFull) the journal also takes
// nothing more until a checkpoint succeeds.
func (s *Store) checkpointEnded(err error) {
	s.ckDone = nil
	if errors.Is(err, store.ErrFull) {
		s.checkpointFull = true
	}
}

// checkpointFrozen writes the frozen layer into bbolt, with next as the
// journal's next generation. It runs in the background checkpoint's
// goroutine.
func (s *Store) checkpointFrozen(next uint64) error {
	start := time.Now()
	b, err := s.transact(func(b *batch) error {
		b.frozenOnly = true
		return b.putJournaled(s.ov.frozen.all(), len(s.ov.frozen.items), next)
	})
	info := store.CommitInfo{Duration: time.Since(start)}
	if err != nil {
		info.Err = commitError(err)
	} else {
		s.applyCommitted(b)
	}
	s.recordCommit(info, false, err == nil)
	return info.Err
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
		for p := range s.ov.items() {
			if len(p.id) == idEpochSize+len(prefix)+store.KeySize && bytes.HasPrefix(p.id[idEpochSize:], prefix) {
				return false
			}
		}
		return true
	case opCancelExchange, opDeleteExchange:
		d, ok := s.exchanges[exKey{r.vhost, r.name}]
		return !ok || s.ov.count(d.Incarnation) == 0
	}
	return false // opCheckpoint: it asked for the journal
}
