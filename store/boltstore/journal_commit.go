package boltstore

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// journalCommit makes a group of Puts durable with one journal append,
// when the group holds Puts alone and fits beside what is journaled
// already, and reports whether it did. Otherwise the group goes to commit,
// which checkpoints first. After a failed append it checkpoints at once,
// so that the record, whatever of it reached the disk, is never replayed.
func (s *Store) journalCommit(group []*request) bool {
	if s.jr == nil || s.journalFailed || s.checkpointFull {
		return false
	}
	count, size := 0, 0
	for _, r := range group {
		if r.kind != opPut {
			return false
		}
		count += len(r.puts)
		size += recordBytes(r.puts)
	}
	if len(s.ov.active.items)+count > s.journalMax || !s.jr.fits(size) {
		// The active generation is full: checkpoint it in the background
		// once the running checkpoint has ended (that wait is the
		// backpressure), and journal this group in the next generation.
		s.awaitCheckpoint()
		if !s.canCheckpointInBackground() || len(s.ov.active.items) == 0 {
			return false
		}
		s.startCheckpoint()
		if count > s.journalMax || !s.jr.fits(size) {
			return false
		}
	}
	start := time.Now()
	live := make([]*request, 0, len(group))
	count = 0
	for _, r := range group {
		if err := r.ctx.Err(); err != nil {
			r.err = err // the caller has gone: leave its request out
			continue
		}
		live = append(live, r)
		count += len(r.puts)
	}
	var err error
	if count > 0 {
		err = s.jr.append(live, count)
	}
	info := store.CommitInfo{Requests: len(group), Messages: count, Duration: time.Since(start)}
	if err != nil {
		err = journalError(err)
		info.Err, info.Messages = err, 0
		s.journalFailed = true
		for _, r := range live {
			r.err = err
		}
	} else {
		s.mu.Lock()
		for _, r := range live {
			s.ov.active.add(r.puts, s.isLive)
		}
		s.mu.Unlock()
		s.maybeCheckpoint()
	}
	s.recordCommit(info, err == nil, false)
	for _, r := range group {
		close(r.done)
	}
	if err != nil {
		_ = s.checkpoint() // a failure leaves journalFailed set: the next commit tries again
	}
	return true
}

// isLive reports whether inc is the incarnation of a registered exchange.
// Callers hold mu (or are the writer).
func (s *Store) isLive(inc uint64) bool {
	_, ok := s.liveIncs()[inc]
	return ok
}

// journalError classifies a failed append.
func journalError(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: journal: %w", store.ErrFull, err)
	}
	return fmt.Errorf("store: journal: %w", err)
}
