package boltstore

import "time"

// Stats are cumulative counters of a Store since Open.
type Stats struct {
	Commits          uint64        // successful group commits (journal appends and bbolt commits)
	JournalCommits   uint64        // of Commits, those that appended to the journal
	Checkpoints      uint64        // of Commits, bbolt commits that took journaled messages
	FailedCommits    uint64        // commits that failed (every request in them failed)
	Requests         uint64        // write requests served by successful commits
	Messages         uint64        // messages written by Put
	Deletes          uint64        // messages removed
	MaxBatch         int           // most messages+deletes seen in one commit
	CommitTime       time.Duration // total time spent in group commits, fsync included
	Cascades         uint64        // cascade passes (far buckets sorted into slots)
	CascadedMessages uint64        // messages moved by cascade passes
	CascadeTime      time.Duration // total time spent in cascade passes
	Stale            int64         // stored messages of deleted or cancelled exchange incarnations
	PageWrites       uint64        // pages bbolt wrote (commits and cascades): write amplification
}

// Stats returns cumulative counters since Open.
func (s *Store) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	s.statsMu.Unlock()
	s.mu.RLock()
	st.Stale = s.stale + s.ov.stale()
	s.mu.RUnlock()
	bs := s.db.Stats()
	st.PageWrites = uint64(bs.TxStats.GetWrite())
	return st
}
