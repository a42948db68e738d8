package releaser

import (
	"slices"
	"sync"
	"time"
)

// confirmState is where one release stands with RabbitMQ.
type confirmState uint8

const (
	unsettled confirmState = iota // neither ack nor nack yet
	acked                         // basic.ack: RabbitMQ took it
	nacked                        // basic.nack: RabbitMQ refused it
)

// pending is one batch of releases written on a connection and awaiting
// RabbitMQ's confirms. Its delivery tags are consecutive: a batch is
// written in one piece, under the connection's write lock.
type pending struct {
	first uint64 // delivery tag of idx[0]
	idx   []int  // each release's position in the caller's batch

	// Guarded by confirms.mu.
	state []confirmState // by position in idx
	low   int            // every state below it is settled
	left  int            // how many are unsettled

	done chan struct{} // closed when every confirm arrived or the connection ended
}

// confirms tracks the batches of one connection awaiting confirms, in tag
// order. Publishers add batches, the connection's reader settles them,
// waiters read them.
type confirms struct {
	mu    sync.Mutex // guards open, ended and the state, low and left of every pending
	open  []*pending // batches with a confirm still to come, in tag order
	ended bool       // the connection ended: no confirm comes any more
}

// add registers a batch whose first release has delivery tag first. It
// reports false, registering nothing, once the connection has ended.
func (cs *confirms) add(first uint64, idx []int) (*pending, bool) {
	p := &pending{first: first, idx: idx, state: make([]confirmState, len(idx)), left: len(idx), done: make(chan struct{})}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.ended {
		return nil, false
	}
	cs.open = append(cs.open, p)
	return p, true
}

// settle records basic.ack (st acked) or basic.nack (nacked) of tag, and
// with multiple of every tag up to it. Tags RabbitMQ confirmed already, or
// never got, are ignored.
func (cs *confirms) settle(tag uint64, multiple bool, st confirmState) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	finished := false
	for _, p := range cs.open {
		if p.first > tag {
			break
		}
		last := int(min(tag-p.first, uint64(len(p.idx)-1)))
		from := last
		if multiple {
			from = p.low
		} else if tag-p.first > uint64(last) {
			continue // a single tag past this batch: a later one holds it
		}
		for k := from; k <= last; k++ {
			if p.state[k] == unsettled {
				p.state[k] = st
				p.left--
			}
		}
		for p.low < len(p.state) && p.state[p.low] != unsettled {
			p.low++
		}
		if p.left == 0 {
			close(p.done)
			finished = true
		}
		if !multiple {
			break
		}
	}
	if finished {
		cs.open = slices.DeleteFunc(cs.open, func(p *pending) bool { return p.left == 0 })
	}
}

// end marks the connection ended: every batch still open is done, its
// unsettled releases unconfirmed. It reports whether any batch was open.
func (cs *confirms) end() (lost bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.ended = true
	for _, p := range cs.open {
		close(p.done)
	}
	lost = len(cs.open) > 0
	cs.open = nil
	return lost
}

// await waits for p's confirms, for at most timeout, and sets
// confirmed[i] for each release RabbitMQ acked. It reports whether the
// connection has ended (end was called).
func (cs *confirms) await(p *pending, timeout time.Duration, confirmed []bool) (ended bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for n, i := range p.idx {
		confirmed[i] = p.state[n] == acked
	}
	return cs.ended
}
