package boltstore

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/delayproxy/delayproxy/store"
)

// commit applies a group of requests in one transaction. A request-level
// refusal (unknown exchange) fails that request alone; a transaction
// failure fails every request of the group. The transaction is also a
// checkpoint: it first writes the journaled messages (the overlay) into
// bbolt and moves the journal to its next generation, so that every bbolt
// write comes after the journaled Puts it may depend on (a Delete of a
// message journaled a moment ago, an exchange deleted after its Puts).
func (s *Store) commit(reqs []*request) {
	s.commitGroup(reqs, true)
}

// commitGroup is commit, with or without the checkpoint. When bbolt has no
// room for the journaled messages (ErrFull), the requests that touch none
// of them are committed again without the checkpoint, so that deletes can
// still make room; the others fail with ErrFull.
func (s *Store) commitGroup(reqs []*request, withCheckpoint bool) {
	s.awaitCheckpoint()
	start := time.Now()
	b, err := s.transact(func(b *batch) error {
		if withCheckpoint {
			if err := b.checkpoint(); err != nil {
				return err
			}
		}
		for _, r := range reqs {
			if cerr := r.ctx.Err(); cerr != nil {
				r.err = cerr // the caller has gone: leave its request out
				continue
			}
			if err := b.apply(r); err != nil {
				return err
			}
		}
		return nil
	})
	dur := time.Since(start)
	if err != nil && b != nil && b.journalGen != 0 && errors.Is(commitError(err), store.ErrFull) {
		err = commitError(err)
		s.checkpointFull = true
		var retry []*request
		for _, r := range reqs {
			if r.err == nil && s.independent(r) {
				retry = append(retry, r)
			} else if r.err == nil {
				r.err = err
			}
		}
		s.recordCommit(store.CommitInfo{Requests: len(reqs) - len(retry), Duration: dur, Err: err}, false, false)
		for _, r := range reqs {
			if r.err != nil {
				close(r.done)
			}
		}
		if len(retry) > 0 {
			s.commitGroup(retry, false)
		}
		return
	}
	info := store.CommitInfo{Requests: len(reqs), Duration: dur}
	if err != nil {
		err = commitError(err)
		info.Err = err
		for _, r := range reqs {
			if r.err == nil {
				r.err = err
			}
		}
	} else {
		s.applyCommitted(b)
		info.Messages, info.Deletes = b.puts-b.journaled, b.deletes
		if b.journalGen != 0 {
			s.jr.restart(b.journalGen)
			s.journalFailed, s.checkpointFull = false, false
		}
	}
	s.recordCommit(info, false, err == nil && b.journalGen != 0)
	for _, r := range reqs {
		close(r.done)
	}
}

// recordCommit counts a group commit in Stats and reports it to Metrics:
// journaled when it was a journal append, checkpoint when it moved
// journaled messages into bbolt.
func (s *Store) recordCommit(info store.CommitInfo, journaled, checkpoint bool) {
	s.statsMu.Lock()
	if info.Err != nil {
		s.stats.FailedCommits++
	} else {
		s.stats.Commits++
		s.stats.Requests += uint64(info.Requests)
		s.stats.Messages += uint64(info.Messages)
		s.stats.Deletes += uint64(info.Deletes)
		s.stats.MaxBatch = max(s.stats.MaxBatch, info.Messages+info.Deletes)
		if journaled {
			s.stats.JournalCommits++
		}
		if checkpoint {
			s.stats.Checkpoints++
		}
	}
	s.stats.CommitTime += info.Duration
	s.statsMu.Unlock()
	if s.opts.Metrics != nil {
		s.opts.Metrics.Commit(info)
	}
}

// transact fills a batch in a new write transaction, finishes it and
// commits; on any error it rolls back. b is nil when the transaction could
// not begin.
func (s *Store) transact(fill func(*batch) error) (b *batch, err error) {
	tx, err := s.db.Begin(true)
	if err != nil {
		return nil, err
	}
	b = s.newBatch(tx)
	if err = fill(b); err == nil {
		err = b.finish()
	}
	if err == nil {
		err = tx.Commit()
	} else {
		tx.Rollback()
	}
	return b, err
}

// commitError classifies a failed transaction.
func commitError(err error) error {
	switch {
	case errors.Is(err, berrors.ErrMaxSizeReached), errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w: %w", store.ErrFull, err)
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return store.ErrClosed
	}
	return fmt.Errorf("store: commit: %w", err)
}

// applyCommitted makes a committed batch visible in memory: registry,
// counters, slot counts and the far minimum.
func (s *Store) applyCommitted(b *batch) {
	s.incCounter = b.incCounter
	s.persistedSeq = b.nextSeq
	if !b.frozenOnly { // a background checkpoint leaves them as they are
		s.goneFirst, s.goneNext = b.goneFirst, b.goneNext
	}
	for idx, c := range b.sc {
		if c.dropped {
			delete(s.slotCounts, idx)
		} else {
			s.slotCounts[idx] = c
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.journalGen != 0 { // now in bbolt: gone from the overlays in the same critical section as the counts
		s.ov.frozen.reset()
		if !b.frozenOnly {
			s.ov.active.reset()
		}
	}
	for k, d := range b.ex {
		if d == nil {
			delete(s.exchanges, k)
		} else {
			s.exchanges[k] = *d
		}
	}
	for inc, d := range b.delta {
		if n := s.counts[inc] + d; n == 0 {
			delete(s.counts, inc)
		} else {
			s.counts[inc] = n
		}
	}
	if len(b.ex) > 0 {
		s.recount()
	} else {
		for inc, d := range b.delta {
			if _, ok := s.liveIncs()[inc]; ok {
				s.live += d
			} else {
				s.stale += d
			}
		}
	}
	for hour, row := range b.tallyRows {
		if row == nil {
			delete(s.tally, hour)
		} else {
			s.tally[hour] = row
		}
	}
	s.farMin, s.farMinOK = b.farMin, b.farMinOK
	if s.scan != nil {
		s.scan.late = append(s.scan.late, b.late...)
	}
}
