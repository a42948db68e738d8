package boltstore

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// The ids entries of removed messages. A message taken out of the store
// (released, cancelled) leaves its ids entry in place and appends that
// entry's key to the ids-gone bucket, in the commit that takes it out:
// one append, where deleting the entry would rewrite a leaf of the ids
// index at a place set by the message's publish order, not its due time
// (a page per message when the messages were published in another order
// than they fall due). The writer deletes them later, oldest first and in
// index order, in commits of their own once it has been idle for
// Store.idleCheckpoint; a commit that leaves more than Store.idsGoneMax
// waiting deletes the excess itself, and every commit deletes them all
// while bbolt is full (deleting makes room).
//
// An entry waiting here names a message that is gone: a cancel by
// message-id that meets it finds no message under its key, as for any
// message taken out.

const (
	// maxIDsGone is the most ids entries left waiting after a commit.
	maxIDsGone = 1 << 16
	// idsGoneChunk is the most ids entries an idle commit deletes.
	idsGoneChunk = 2048
)

// idGone records the ids entry idKey of a message taken out, to be
// deleted later.
func (b *batch) idGone(idKey []byte) error {
	b.gone.FillPercent = 1 // appended to: pages packed full
	if err := b.gone.Put(u64(b.goneNext), idKey); err != nil {
		return err
	}
	b.goneNext++
	return nil
}

// idsGone is the number of ids entries waiting, this batch included.
func (b *batch) idsGone() uint64 { return b.goneNext - b.goneFirst }

// dropGone deletes the n oldest ids entries waiting (fewer if fewer wait),
// in index order.
func (b *batch) dropGone(n uint64) error {
	n = min(n, b.idsGone())
	if n == 0 {
		return nil
	}
	keys := make([][]byte, 0, n)
	c := b.gone.Cursor()
	for k, v := c.Seek(u64(b.goneFirst)); k != nil && uint64(len(keys)) < n; k, v = c.Next() {
		keys = append(keys, bytes.Clone(v)) // v lives only until the bucket changes
	}
	if uint64(len(keys)) != n {
		return fmt.Errorf("store: internal: %d ids entries waiting from %d, found %d", b.idsGone(), b.goneFirst, len(keys))
	}
	for range n {
		if err := b.gone.Delete(u64(b.goneFirst)); err != nil {
			return err
		}
		b.goneFirst++
	}
	slices.SortFunc(keys, bytes.Compare)
	for _, k := range keys {
		if err := b.ids.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// dropExcessGone, at the end of a commit, deletes the ids entries waiting
// beyond Store.idsGoneMax, or all of them while bbolt is full.
func (b *batch) dropExcessGone() error {
	limit := b.s.idsGoneMax
	if b.s.checkpointFull {
		limit = 0
	}
	if n := b.idsGone(); n > limit {
		return b.dropGone(n - limit)
	}
	return nil
}

// dropIDsGone is the writer's idle commit: it deletes up to idsGoneChunk
// of the ids entries waiting. A failure leaves them waiting. It does not
// checkpoint the journal first, as other commits do: it touches only the
// entries of messages already taken out of bbolt, never a journaled one.
func (s *Store) dropIDsGone() {
	s.awaitCheckpoint()
	start := time.Now()
	b, err := s.transact(func(b *batch) error { return b.dropGone(idsGoneChunk) })
	if err != nil {
		err = commitError(err)
	} else {
		s.applyCommitted(b)
	}
	s.recordCommit(store.CommitInfo{Duration: time.Since(start), Err: err}, false, false)
}
