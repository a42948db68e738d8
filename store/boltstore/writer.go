package boltstore

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

const (
	// requestQueue is the capacity of the writer's request channel.
	requestQueue = 4096
	// maxYields bounds how often the writer yields the processor while the
	// queue keeps growing before it commits.
	maxYields = 16
)

type opKind uint8

const (
	opPut opKind = iota
	opDelete
	opCancelID
	opCancelKey
	opCancelExchange
	opPutExchange
	opDeleteExchange
	opCascade // move the watermark to at least target (between commits)
	opNextDue // earliest due over slots and far buckets (between commits)
	opCheck   // integrity check (between commits)
	// opCheckpoint writes the journaled messages into bbolt: a commit of
	// nothing else (reads that walk bbolt ask for it).
	opCheckpoint
)

// putItem is one message prepared by Put in the caller's goroutine.
type putItem struct {
	key store.Key
	val []byte // encoded message
	inc uint64
	id  []byte // ids index key, nil without a message-id
}

// request is one call handed to the writer. Results are valid once done is
// closed.
type request struct {
	kind   opKind
	ctx    context.Context
	puts   []putItem
	one    [1]putItem // puts of a Put of one message
	keys   []store.Key
	vhost  string
	name   string
	id     string
	def    *store.ExchangeDef // opPutExchange: a copy of the caller's
	target int64

	n       int64
	ok      bool
	removed []store.Key // opCancelID: the pending messages it removed
	err     error
	done    chan struct{}
}

func (r *request) weight() int {
	switch r.kind {
	case opPut:
		return len(r.puts)
	case opDelete:
		return len(r.keys)
	}
	return 1
}

// run is the writer goroutine: it commits queued requests in groups and
// drives cascades between commits. It exits when reqs is closed and
// drained and no cascade scan is running.
func (s *Store) run() {
	defer close(s.done)
	var cascades []*request // waiting for the watermark to reach their target
	reqs := s.reqs          // nil once closed
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	defer idle.Stop()
	for reqs != nil || s.scan != nil {
		var batch, between []*request
		n := 0
		take := func(r *request) {
			switch r.kind {
			case opCascade, opNextDue, opCheck:
				between = append(between, r)
			default:
				batch = append(batch, r)
				n += r.weight()
			}
		}
		var scanDone <-chan scanResult
		if s.scan != nil {
			scanDone = s.scan.done
		}
		var cascadeErr error
		// Journaled messages, or ids entries waiting (idsgone.go), and
		// nothing queued: checkpoint the messages in the background, or
		// else delete a chunk of the entries, once no request came for
		// s.idleCheckpoint. Under load a request is always queued, so the
		// timer is left alone (a Reset discards whatever an earlier
		// arming left in it).
		var idleDue <-chan time.Time
		checkpointWhenIdle := len(s.ov.active.items) > 0 && s.canCheckpointInBackground()
		dropWhenIdle := s.ckDone == nil && s.goneNext > s.goneFirst
		if len(reqs) == 0 && (checkpointWhenIdle || dropWhenIdle) && s.idleCheckpoint > 0 {
			idle.Reset(s.idleCheckpoint)
			idleDue = idle.C
		}
		select {
		case r, ok := <-reqs:
			if ok {
				take(r)
			} else {
				reqs = nil
			}
		case res := <-scanDone:
			s.awaitCheckpoint()
			cascadeErr = s.moveCascade(res)
		case err := <-s.ckDone:
			s.checkpointEnded(err)
			s.maybeCheckpoint()
		case <-idleDue:
			if checkpointWhenIdle {
				s.startCheckpoint()
			} else {
				s.dropIDsGone()
			}
		}
		// Take everything that queued up during the previous commit. When
		// the queue runs dry, yield the processor so that callers just
		// released by the previous commit can queue again, as long as that
		// brings new requests: with many writers this keeps batches full
		// instead of alternating full and small ones. No timer.
		yields, sinceYield := 0, 0
	gather:
		for reqs != nil && n < s.maxBatch {
			select {
			case r, ok := <-reqs:
				if !ok {
					reqs = nil
					break gather
				}
				take(r)
				sinceYield++
			default:
				if n == 0 || yields == maxYields || (yields > 0 && sinceYield == 0) {
					break gather
				}
				yields++
				sinceYield = 0
				runtime.Gosched()
			}
		}
		if len(batch) > 0 && !s.journalCommit(batch) {
			s.commit(batch)
		}
		if len(between) > 0 || len(cascades) > 0 {
			s.awaitCheckpoint() // they read or write what the checkpoint uses
		}
		for _, r := range between {
			switch r.kind {
			case opCascade:
				cascades = append(cascades, r)
			case opNextDue:
				r.n, r.ok, r.err = s.nextDueExact()
				close(r.done)
			case opCheck:
				// Check bbolt as it is when the journaled messages
				// cannot go in for want of room.
				if r.err = s.checkpoint(); r.err == nil || errors.Is(r.err, store.ErrFull) {
					r.err = s.check()
				}
				close(r.done)
			}
		}
		cascades = s.cascadeStep(cascades, reqs != nil, cascadeErr)
	}
	// Closing: leave nothing in the journal that a clean Close could have
	// put in bbolt (a failure here leaves it to the next Open's replay).
	_ = s.checkpoint()
}
