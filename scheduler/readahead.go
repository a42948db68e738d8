package scheduler

import (
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The read-ahead (Options.ReadAhead). When a store read is a round trip to
// a database, reading each batch only once it is due puts that round trip,
// and every stall of the database, into every release's lateness. With a
// read-ahead, the loop peeks at the keys falling due within ReadAhead
// (Wheel.Peek) and hands them to fetchLoop, which reads them at once and
// keeps the messages until their keys are dispatched. Dispatch itself is
// unchanged: keys leave the wheel at their due time and in release order,
// and a batch takes what was read ahead for its keys and reads the rest.
//
// The wheel stays the gate: a message cancelled after it was read ahead
// (Cancelled) leaves the wheel and is never dispatched, and its read is
// dropped. A message read ahead whose key then misses the cache (a retry,
// a read that failed) is read again at dispatch. Reads ahead go out in
// steps of a fifth of ReadAhead, so a message is read between 4/5 of
// ReadAhead and ReadAhead before its due time, in one read per step
// rather than one per batch.

// readAheadSteps is how many reads ahead cover one ReadAhead.
const readAheadSteps = 5

// readsQueued is how many reads ahead wait for fetchLoop; when they are
// full, the loop skips a step and those keys are read at dispatch.
const readsQueued = 8

// readAhead hands fetchLoop the keys due within ReadAhead of now that
// earlier steps did not cover, once a step's worth of time has passed.
func (s *Scheduler) readAhead(now time.Time) {
	ra := s.opts.ReadAhead.Milliseconds()
	if ra <= 0 {
		return
	}
	until := now.UnixMilli() + ra
	if until < s.readTo+readAheadStep(ra) {
		return
	}
	keys := s.w.Peek(s.readTo, until, nil)
	s.readTo = until
	if len(keys) == 0 {
		return
	}
	select {
	case s.reads <- keys:
		s.readsOut.Add(1)
	default: // fetchLoop is behind: these keys are read at dispatch
	}
}

// readAheadWake is when the loop should wake for the next read ahead: a
// step after the last one, and no earlier than ReadAhead before the next
// key it has not covered; false when there is none.
func (s *Scheduler) readAheadWake() (time.Time, bool) {
	ra := s.opts.ReadAhead.Milliseconds()
	if ra <= 0 {
		return time.Time{}, false
	}
	next, ok := s.w.NextAfter(s.readTo)
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(max(next, s.readTo+readAheadStep(ra)) - ra), true
}

// readAheadStep is the least time (ms) between two reads ahead of a
// read-ahead of ra ms: a fifth of it, at least a millisecond.
func readAheadStep(ra int64) int64 { return max(ra/readAheadSteps, 1) }

// readsAhead is fetchLoop's cache of messages read ahead, by key. Only
// fetchLoop uses it.
type readsAhead struct {
	byKey map[store.Key]aheadRead
	reads int // reads ahead started, for the periodic expiry
}

// aheadRead is one key's place in a read ahead: the i-th of f's messages.
type aheadRead struct {
	f *fetch
	i int
}

// aheadKeptMs is how long past its due time a read ahead whose key was
// not dispatched (cancelled, evicted) is kept; fetchLoop then drops it, and
// a key dispatched later after all (a retry) is read again.
const aheadKeptMs = 1000

// startReadAhead starts the read of keys (in key order), ahead of their
// dispatch, and records it in c. Every 16th read it drops what is kept
// past aheadKeptMs.
func (s *Scheduler) startReadAhead(c *readsAhead, keys []store.Key, gets chan struct{}) {
	if c.reads++; c.reads%16 == 0 {
		c.expireBefore(keys[0].Due() - s.opts.ReadAhead.Milliseconds() - aheadKeptMs)
	}
	f := &fetch{done: make(chan struct{})}
	for i, k := range keys {
		c.byKey[k] = aheadRead{f: f, i: i}
	}
	s.startGet(f, keys, gets, func() {
		s.readsOut.Add(-1)
		if s.idle != nil {
			s.kick() // tests wait for the loop to see reads ahead done
		}
	})
}

// take removes what was read ahead for keys and returns it, by index in
// keys; a key not read ahead has a zero entry.
func (c *readsAhead) take(keys []store.Key) (got []aheadRead, any bool) {
	for i, k := range keys {
		a, ok := c.byKey[k]
		if !ok {
			continue
		}
		if got == nil {
			got = make([]aheadRead, len(keys))
		}
		got[i], any = a, true
		delete(c.byKey, k)
	}
	return got, any
}

// expireBefore drops the reads ahead of keys due before due.
func (c *readsAhead) expireBefore(due int64) {
	for k := range c.byKey {
		if k.Due() < due {
			delete(c.byKey, k)
		}
	}
}

// readRest waits for what was read ahead for keys (got, by index) and
// reads the keys that were not, or whose read ahead failed.
func (s *Scheduler) readRest(keys []store.Key, got []aheadRead, gets chan struct{}) ([]*store.Message, error) {
	msgs := make([]*store.Message, len(keys))
	var rest []int
	for i, a := range got {
		if a.f != nil {
			<-a.f.done
			if a.f.err == nil {
				msgs[i] = a.f.msgs[a.i]
				continue
			}
		}
		rest = append(rest, i)
	}
	if len(rest) == 0 {
		return msgs, nil
	}
	missing := make([]store.Key, len(rest))
	for j, i := range rest {
		missing[j] = keys[i]
	}
	gets <- struct{}{}
	read, err := s.st.Get(missing)
	<-gets
	if err != nil {
		return nil, err
	}
	for j, i := range rest {
		msgs[i] = read[j]
	}
	return msgs, nil
}
