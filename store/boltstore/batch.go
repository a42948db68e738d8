package boltstore

import (
	"bytes"
	"cmp"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"

	"github.com/delayproxy/delayproxy/store"
)

// batch is the working state of one group commit. Registry and counter
// changes live here until the commit succeeds.
type batch struct {
	s                                     *Store
	tx                                    *bolt.Tx
	slots, far, ids, exch, meta, countsBk *bolt.Bucket
	released, tallyBk, gone               *bolt.Bucket

	slotB   map[int64]*bolt.Bucket // slot buckets opened in this tx, by slot index
	farB    map[int64]*bolt.Bucket // far buckets opened in this tx, by far index
	relB    map[int64]*bolt.Bucket // released buckets opened in this tx, by slot index
	drained map[int64]struct{}     // slots that had messages released
	sc      map[int64]slotCount    // Store.slotCounts overlay; dropped: slot gone

	ex         map[exKey]*store.ExchangeDef // registry overlay; nil: deleted
	delta      map[uint64]int64             // count changes per incarnation
	tally      map[int64]int64              // tally changes per due minute
	tallyRows  map[int64]*tallyRow          // rows written by finish (nil: gone)
	incCounter uint64
	nextSeq    uint64
	// goneFirst and goneNext bound the keys of the ids-gone bucket
	// (idsgone.go): [goneFirst, goneNext).
	goneFirst, goneNext uint64
	farMin              int64
	farMinOK            bool

	late          []store.Key // far puts into the range of the running cascade scan
	puts, deletes int

	journaled  int    // messages of the journal written by this batch (see checkpoint)
	journalGen uint64 // the journal's next generation once this batch commits; 0: unchanged
	frozenOnly bool   // a background checkpoint: it writes the frozen layer alone
}

func (s *Store) newBatch(tx *bolt.Tx) *batch {
	meta := tx.Bucket(bucketMeta)
	return &batch{
		s: s, tx: tx,
		slots: tx.Bucket(bucketSlots), far: tx.Bucket(bucketFar), ids: tx.Bucket(bucketIDs),
		exch: tx.Bucket(bucketExchanges), meta: meta, countsBk: meta.Bucket(bucketCounts),
		released: tx.Bucket(bucketReleased), tallyBk: meta.Bucket(bucketTally), gone: tx.Bucket(bucketIDsGone),
		slotB: map[int64]*bolt.Bucket{}, farB: map[int64]*bolt.Bucket{}, relB: map[int64]*bolt.Bucket{},
		drained: map[int64]struct{}{}, sc: map[int64]slotCount{},
		ex: map[exKey]*store.ExchangeDef{}, delta: map[uint64]int64{}, tally: map[int64]int64{},
		incCounter: s.incCounter, nextSeq: s.persistedSeq, goneFirst: s.goneFirst, goneNext: s.goneNext,
		farMin: s.farMin, farMinOK: s.farMinOK,
	}
}

// exchange looks an exchange up through the batch overlay.
func (b *batch) exchange(k exKey) (store.ExchangeDef, bool) {
	if d, ok := b.ex[k]; ok {
		if d == nil {
			return store.ExchangeDef{}, false
		}
		return *d, true
	}
	d, ok := b.s.exchanges[k]
	return d, ok
}

// count is the number of stored messages of an incarnation, this batch
// included.
func (b *batch) count(inc uint64) int64 { return b.s.counts[inc] + b.delta[inc] }

func (b *batch) apply(r *request) error {
	switch r.kind {
	case opCheckpoint:
		// Nothing: every commit checkpoints first.
	case opPut:
		for i := range r.puts {
			if err := b.put(&r.puts[i]); err != nil {
				return err
			}
		}
	case opDelete:
		for _, k := range r.keys {
			if _, _, err := b.remove(k); err != nil {
				return err
			}
		}
	case opCancelKey:
		inc, found, err := b.remove(r.keys[0])
		if err != nil {
			return err
		}
		if _, live := b.liveIncarnation(inc); found && live {
			r.n = 1
		}
	case opCancelID:
		keys := b.idKeys(r.vhost, r.name, r.id)
		d, known := b.exchange(exKey{r.vhost, r.name})
		for _, k := range keys {
			inc, found, err := b.remove(k)
			if err != nil {
				return err
			}
			if found && known && inc == d.Incarnation {
				r.removed = append(r.removed, k)
			}
		}
	case opPutExchange:
		d := *r.def
		if old, ok := b.exchange(exKey{d.VHost, d.Name}); ok {
			d.Incarnation = old.Incarnation
		} else {
			b.incCounter++
			d.Incarnation = b.incCounter
		}
		if err := b.exch.Put(exchangeKey(d.VHost, d.Name), encodeExchange(&d)); err != nil {
			return err
		}
		b.ex[exKey{d.VHost, d.Name}] = &d
		*r.def = d
	case opCancelExchange, opDeleteExchange:
		k := exKey{r.vhost, r.name}
		d, ok := b.exchange(k)
		if !ok {
			r.err = fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, r.name, r.vhost)
			return nil
		}
		r.n = b.count(d.Incarnation)
		if r.kind == opDeleteExchange {
			if err := b.exch.Delete(exchangeKey(d.VHost, d.Name)); err != nil {
				return err
			}
			b.ex[k] = nil
			return nil
		}
		b.incCounter++
		d.Incarnation = b.incCounter
		if err := b.exch.Put(exchangeKey(d.VHost, d.Name), encodeExchange(&d)); err != nil {
			return err
		}
		b.ex[k] = &d
	default:
		return fmt.Errorf("store: internal: op %d in a commit", r.kind)
	}
	return nil
}

// liveIncarnation reports whether inc is the current incarnation of a
// registered exchange, through the batch overlay.
func (b *batch) liveIncarnation(inc uint64) (exKey, bool) {
	for k, d := range b.ex {
		if d != nil && d.Incarnation == inc {
			return k, true
		}
	}
	k, ok := b.s.liveIncs()[inc]
	if !ok {
		return k, false
	}
	d, ok := b.exchange(k)
	return k, ok && d.Incarnation == inc
}

// slot opens (or creates) the slot bucket of index idx.
func (b *batch) slot(idx int64, create bool) (*bolt.Bucket, error) {
	return nested(b.slots, b.slotB, idx, create)
}

// farBucket opens (or creates) the far bucket of index idx.
func (b *batch) farBucket(idx int64, create bool) (*bolt.Bucket, error) {
	return nested(b.far, b.farB, idx, create)
}

// nested opens the bucket under parent keyed by idx (8 B BE), creating it
// when create is set, through open (the buckets of this tx). Every nested
// bucket is appended to (slots and far buckets in sequence order, released
// buckets in release order, mostly), so its pages are packed full.
func nested(parent *bolt.Bucket, open map[int64]*bolt.Bucket, idx int64, create bool) (*bolt.Bucket, error) {
	if bk := open[idx]; bk != nil {
		return bk, nil
	}
	key := u64(uint64(idx))
	bk := parent.Bucket(key)
	if bk == nil {
		if !create {
			return nil, nil
		}
		var err error
		if bk, err = parent.CreateBucket(key); err != nil {
			return nil, err
		}
	}
	bk.FillPercent = 1
	open[idx] = bk
	return bk, nil
}

// idKeys finds the keys of an exchange's messages with one message-id:
// one seek into each epoch of the ids index that holds an entry.
func (b *batch) idKeys(vhost, exchange, id string) []store.Key {
	var keys []store.Key
	c := b.ids.Cursor()
	for k, _ := c.First(); k != nil; {
		epoch := beUint64(k[:idEpochSize])
		prefix := idPrefix(epoch, []byte(vhost), []byte(exchange), []byte(id))
		for k, _ = c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(k) == len(prefix)+store.KeySize {
				keys = append(keys, store.Key(k[len(prefix):]))
			}
		}
		if epoch == math.MaxUint64 {
			break
		}
		k, _ = c.Seek(u64(epoch + 1))
	}
	return keys
}

// put stores one message: into its slot when due before the watermark,
// otherwise appended to its far bucket.
func (b *batch) put(p *putItem) error {
	due := p.key.Due()
	var err error
	if due < b.s.watermark {
		var bk *bolt.Bucket
		idx := due / b.s.slotMs
		if bk, err = b.slot(idx, true); err == nil {
			err = bk.Put(storedKey(p.key), p.val)
		}
		if c, ok := b.slotCount(idx); ok {
			c.entries++
			b.sc[idx] = c
		}
	} else {
		var bk *bolt.Bucket
		if bk, err = b.farBucket(due/b.s.farMs, true); err == nil {
			err = bk.Put(storedKey(p.key), p.val)
		}
		if b.farMinOK && due < b.farMin {
			b.farMin = due
		}
		if sc := b.s.scan; sc != nil && due >= sc.from && due < sc.hi {
			b.late = append(b.late, p.key)
		}
	}
	if err != nil {
		return err
	}
	if p.id != nil {
		if err := b.ids.Put(p.id, nil); err != nil {
			return err
		}
	}
	b.delta[p.inc]++
	b.addTally(due, 1)
	b.puts++
	b.nextSeq = max(b.nextSeq, p.key.Seq()+1)
	return nil
}

// remove takes one message out of the store and deletes its ids entry,
// and returns the incarnation it was stored with. A message in a slot is
// marked released (appended to the slot's released bucket, in release
// order) instead of deleted in place, so that releasing never rewrites the
// slot's pages; finish drops the slot whole once every message in it is
// released. A message in a far bucket is deleted.
func (b *batch) remove(k store.Key) (inc uint64, found bool, err error) {
	due := k.Due()
	key := storedKey(k)
	if due >= b.s.watermark {
		bk, err := b.farBucket(due/b.s.farMs, false)
		if bk == nil || err != nil {
			return 0, false, err
		}
		c := bk.Cursor()
		ck, v := c.Seek(key)
		if !bytes.Equal(ck, key) {
			return 0, false, nil
		}
		mv, err := viewMessage(v)
		if err != nil {
			return 0, false, fmt.Errorf("key %x: %w", k[:], err)
		}
		if err := c.Delete(); err != nil {
			return 0, false, err
		}
		if due <= b.farMin {
			b.farMinOK = false
		}
		return b.removed(k, mv)
	}
	idx := due / b.s.slotMs
	bk, err := b.slot(idx, false)
	if bk == nil || err != nil {
		return 0, false, err
	}
	v := bk.Get(key) // a read: the slot's pages stay as they are
	if v == nil {
		return 0, false, nil
	}
	rb, err := b.releasedBucket(idx, true)
	if err != nil {
		return 0, false, err
	}
	if rb.Get(k[:]) != nil {
		return 0, false, nil // released before
	}
	mv, err := viewMessage(v)
	if err != nil {
		return 0, false, fmt.Errorf("key %x: %w", k[:], err)
	}
	c, ok := b.slotCount(idx)
	if !ok {
		c = slotCount{entries: keyCount(bk), marks: keyCount(rb)} // this tx's changes included
	}
	if err := rb.Put(k[:], releasedMark); err != nil {
		return 0, false, err
	}
	c.marks++
	b.sc[idx] = c
	b.drained[idx] = struct{}{}
	return b.removed(k, mv)
}

// removed counts a message taken out and leaves its ids entry to be
// deleted later (idsgone.go).
func (b *batch) removed(k store.Key, mv msgView) (inc uint64, found bool, err error) {
	if mv.flags&flagMessageID != 0 {
		if err := b.idGone(idKey(mv.vhost, mv.exchange, mv.messageID, k)); err != nil {
			return 0, false, err
		}
	}
	b.delta[mv.incarnation]--
	b.addTally(k.Due(), -1)
	b.deletes++
	return mv.incarnation, true, nil
}

// finish drops the slots whose messages are all released, with their
// released buckets, deletes the ids entries waiting beyond their bound,
// and writes counters and tally rows into meta.
func (b *batch) finish() error {
	if !b.frozenOnly { // a background checkpoint only puts
		if err := b.dropExcessGone(); err != nil {
			return err
		}
	}
	for idx := range b.drained {
		bk, err := b.slot(idx, false)
		if err != nil {
			return err
		}
		rb, err := b.releasedBucket(idx, false)
		if bk == nil || rb == nil || err != nil {
			return cmp.Or(err, fmt.Errorf("store: internal: slot %d released without its buckets", idx))
		}
		if c, _ := b.slotCount(idx); c.marks < c.entries {
			continue
		}
		// Marks are only made for entries of the slot, and entries leave
		// it only with the whole slot: equal counts mean all released.
		// The counts in memory only say when to look.
		entries, marks := keyCount(bk), keyCount(rb)
		if marks != entries {
			b.sc[idx] = slotCount{entries: entries, marks: marks}
			continue
		}
		key := u64(uint64(idx))
		if err := b.slots.DeleteBucket(key); err != nil {
			return err
		}
		if err := b.released.DeleteBucket(key); err != nil {
			return err
		}
		delete(b.slotB, idx)
		delete(b.relB, idx)
		b.sc[idx] = slotCount{dropped: true}
	}
	for inc, d := range b.delta {
		if d == 0 {
			continue
		}
		n := b.count(inc)
		var err error
		switch {
		case n < 0:
			err = fmt.Errorf("store: internal: count of incarnation %d would be %d", inc, n)
		case n == 0:
			err = b.countsBk.Delete(u64(inc))
		default:
			err = b.countsBk.Put(u64(inc), u64(uint64(n)))
		}
		if err != nil {
			return err
		}
	}
	var err error
	if b.tallyRows, err = b.writeTally(); err != nil {
		return err
	}
	if b.nextSeq != b.s.persistedSeq {
		if err := b.meta.Put(metaSeq, u64(b.nextSeq)); err != nil {
			return err
		}
	}
	if b.journalGen != 0 {
		if err := b.meta.Put(metaJournal, journalMeta(b.s.jr.id, b.journalGen)); err != nil {
			return err
		}
	}
	if b.incCounter != b.s.incCounter {
		if err := b.meta.Put(metaIncarnation, u64(b.incCounter)); err != nil {
			return err
		}
	}
	return nil
}
