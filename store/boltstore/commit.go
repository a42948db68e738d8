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
// failure fails every request of the group.
func (s *Store) commit(reqs []*request) {
	start := time.Now()
	var b *batch
	tx, err := s.db.Begin(true)
	if err == nil {
		b = s.newBatch(tx)
		for _, r := range reqs {
			if cerr := r.ctx.Err(); cerr != nil {
				r.err = cerr // the caller has gone: leave its request out
				continue
			}
			if err = b.apply(r); err != nil {
				break
			}
		}
		if err == nil {
			err = b.finish()
		}
		if err == nil {
			err = tx.Commit()
		} else {
			tx.Rollback()
		}
	}
	dur := time.Since(start)
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
		info.Messages, info.Deletes = b.puts, b.deletes
	}
	s.statsMu.Lock()
	if err != nil {
		s.stats.FailedCommits++
	} else {
		s.stats.Commits++
		s.stats.Requests += uint64(len(reqs))
		s.stats.Messages += uint64(b.puts)
		s.stats.Deletes += uint64(b.deletes)
		s.stats.MaxBatch = max(s.stats.MaxBatch, b.puts+b.deletes)
	}
	s.stats.CommitTime += dur
	s.statsMu.Unlock()
	if s.opts.Metrics != nil {
		s.opts.Metrics.Commit(info)
	}
	for _, r := range reqs {
		close(r.done)
	}
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
	for idx, c := range b.sc {
		if c.dropped {
			delete(s.slotCounts, idx)
		} else {
			s.slotCounts[idx] = c
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
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
			if _, ok := s.liveInc[inc]; ok {
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
