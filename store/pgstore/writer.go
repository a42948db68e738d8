package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayproxy/delayproxy/store"
)

// commitTimeout bounds one group commit, so that a database that stops
// answering fails the requests in it instead of holding them forever.
const commitTimeout = 30 * time.Second

// commitRetries is how often a commit that PostgreSQL aborted for a
// deadlock or a serialization failure is tried again.
const commitRetries = 3

// kind is what a request asks the writer to do.
type kind uint8

const (
	opPut kind = iota
	opDelete
	opCancelID
	opCancelKey
)

// request is one write call waiting for its group commit.
type request struct {
	ctx  context.Context
	kind kind
	msgs []*store.Message // opPut
	keys []store.Key      // opDelete, opCancelKey (one)

	vhost, exchange, id string // opCancelID

	// Results, set by the writer before done is sent.
	cancelled []store.Key // opCancelID, opCancelKey: the pending ones removed
	done      chan error  // buffered: the writer never blocks on it
}

// size is the request's weight against Options.MaxBatch.
func (r *request) size() int { return len(r.msgs) + len(r.keys) + 1 }

// submit queues r for the writer and waits for its commit or ctx.
func (s *Store) submit(ctx context.Context, r *request) error {
	if err := s.enqueue(ctx, r); err != nil {
		return err
	}
	return s.await(ctx, r)
}

// enqueue queues r for the writer; requests queued one after another are
// taken in that order.
func (s *Store) enqueue(ctx context.Context, r *request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.ctx, r.done = ctx, make(chan error, 1)
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	s.reqs <- r
	return nil
}

// await waits for the answer to r, queued by enqueue.
func (s *Store) await(ctx context.Context, r *request) error {
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writer forms the group commits: it takes the first queued request and
// every request that queued meanwhile (up to MaxBatch), gives the batch's
// messages their sequences in queue order, and hands the batch to the
// first free committer; while every committer is busy, requests queue up
// for the next batch. It exits once Close closed reqs and the queue is
// drained, after the committers.
func (s *Store) writer() {
	batches := make(chan []*request)
	var committers sync.WaitGroup
	for i := range s.opts.Committers {
		shard := (s.shard + int16(i)) % shards
		committers.Go(func() {
			for batch := range batches {
				s.commitBatch(batch, shard)
			}
		})
	}
	defer func() {
		close(batches)
		committers.Wait()
	}()
	var carry *request // the request that did not fit the last batch
	for {
		first := carry
		carry = nil
		if first == nil {
			var ok bool
			if first, ok = <-s.reqs; !ok {
				return
			}
		}
		batch, n := []*request{first}, first.size()
	drain:
		for n < s.opts.MaxBatch {
			select {
			case r, ok := <-s.reqs:
				if !ok {
					break drain
				}
				if n+r.size() > s.opts.MaxBatch {
					carry = r
					break drain
				}
				batch, n = append(batch, r), n+r.size()
			default:
				break drain
			}
		}
		if err := s.assignKeys(batch); err != nil {
			s.fail(batch, err)
			continue
		}
		batches <- batch
	}
}

// assignKeys gives the messages of batch's Puts their keys, in queue
// order: a Put that returned before another was queued has the smaller
// sequence. Writer goroutine only.
func (s *Store) assignKeys(batch []*request) error {
	n := 0
	for _, r := range batch {
		if r.kind == opPut {
			n += len(r.msgs)
		}
	}
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	seqs, err := s.takeSeqs(ctx, n)
	if err != nil {
		return err
	}
	for _, r := range batch {
		if r.kind != opPut {
			continue
		}
		for _, m := range r.msgs {
			m.Key = store.MakeKey(m.Due, m.Priority, keyedSeq(seqs[0], PartitionOf(m.Incarnation)))
			seqs = seqs[1:]
		}
	}
	return nil
}

// fail answers every request of a batch that could not be committed.
func (s *Store) fail(batch []*request, err error) {
	err = classify(err)
	s.recordCommit(store.CommitInfo{Requests: len(batch), Err: err})
	for _, r := range batch {
		r.done <- err
	}
}

// commitBatch commits batch, its counts and tally in the rows of shard,
// retrying what PostgreSQL aborted for a conflict with another
// transaction, and answers every request.
func (s *Store) commitBatch(batch []*request, shard int16) {
	live := batch[:0:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- err // its caller has gone: nothing of it is written
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	start := time.Now()
	var c *commit
	var err error
	for attempt := 0; ; attempt++ {
		c = newCommit(s, live, shard)
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		err = c.run(ctx)
		cancel()
		if err == nil || attempt == commitRetries || !retryable(err) {
			break
		}
	}
	err = classify(s.resolveInDoubt(c, err))
	info := store.CommitInfo{Requests: len(live), Messages: c.written, Deletes: c.deleted, Duration: time.Since(start), Err: err}
	s.recordCommit(info)
	for _, r := range live {
		switch {
		case c.refused[r] != nil:
			r.done <- c.refused[r]
		default:
			r.done <- err
		}
	}
}

// retryable reports whether PostgreSQL aborted the transaction for a
// conflict that a new attempt may not meet.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// classify maps PostgreSQL's out-of-space errors to store.ErrFull.
func classify(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "53100" || pe.Code == "53200") {
		return fmt.Errorf("%w: %v", store.ErrFull, err)
	}
	if err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	return nil
}
