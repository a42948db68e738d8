package pgstore

import (
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// Stats are cumulative counters of this node's Store since Open, and the
// stale messages of the whole store.
type Stats struct {
	Commits       uint64        // successful group commits
	FailedCommits uint64        // commits that failed (every request in them failed)
	Requests      uint64        // write requests served by successful commits
	Messages      uint64        // messages written by Put
	Deletes       uint64        // messages removed
	MaxBatch      int           // most messages+deletes seen in one commit
	CommitTime    time.Duration // total time spent in group commits
	Stale         int64         // stored messages of deleted or cancelled exchange incarnations, every node's
}

// Stats returns the counters; Stale is read from the count rows (-1 when
// the database cannot be read).
func (s *Store) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	s.statsMu.Unlock()
	st.Stale = -1
	ctx, cancel := readCtx()
	defer cancel()
	_ = s.pool.QueryRow(ctx, sql(s.schema, `SELECT coalesce(sum(n), 0)::bigint FROM S.counts c
		WHERE NOT EXISTS (SELECT 1 FROM S.exchanges e WHERE e.incarnation = c.incarnation)`)).Scan(&st.Stale)
	return st
}

// recordCommit adds one group commit to the stats and tells Metrics.
func (s *Store) recordCommit(info store.CommitInfo) {
	s.statsMu.Lock()
	if info.Err != nil {
		s.stats.FailedCommits++
	} else {
		s.stats.Commits++
		s.stats.Requests += uint64(info.Requests)
		s.stats.Messages += uint64(info.Messages)
		s.stats.Deletes += uint64(info.Deletes)
		s.stats.MaxBatch = max(s.stats.MaxBatch, info.Messages+info.Deletes)
	}
	s.stats.CommitTime += info.Duration
	s.statsMu.Unlock()
	if s.opts.Metrics != nil {
		s.opts.Metrics.Commit(info)
	}
}
