package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// maxYields bounds how often the writer yields the processor while the
// queue keeps growing before it commits.
const maxYields = 16

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
)

// putItem is one message prepared by Put in the caller's goroutine.
type putItem struct {
	key Key
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
	keys   []Key
	vhost  string
	name   string
	id     string
	def    ExchangeDef
	target int64

	n    int64
	ok   bool
	err  error
	done chan struct{}
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
		select {
		case r, ok := <-reqs:
			if ok {
				take(r)
			} else {
				reqs = nil
			}
		case res := <-scanDone:
			cascadeErr = s.moveCascade(res)
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
		if len(batch) > 0 {
			s.commit(batch)
		}
		for _, r := range between {
			switch r.kind {
			case opCascade:
				cascades = append(cascades, r)
			case opNextDue:
				r.n, r.ok, r.err = s.nextDueExact()
				close(r.done)
			case opCheck:
				r.err = s.check()
				close(r.done)
			}
		}
		cascades = s.cascadeStep(cascades, reqs != nil, cascadeErr)
	}
}

// batch is the working state of one group commit. Registry and counter
// changes live here until the commit succeeds.
type batch struct {
	s                                     *Store
	tx                                    *bolt.Tx
	slots, far, ids, exch, meta, countsBk *bolt.Bucket

	slotB   map[int64]*bolt.Bucket // slot buckets opened in this tx, by slot index
	farB    map[int64]*bolt.Bucket // far buckets opened in this tx, by far index
	drained map[int64]struct{}     // slots that lost messages

	ex         map[exKey]*ExchangeDef // registry overlay; nil: deleted
	delta      map[uint64]int64       // count changes per incarnation
	incCounter uint64
	nextSeq    uint64
	farMin     int64
	farMinOK   bool

	late          []Key // far puts into the range of the running cascade scan
	puts, deletes int
}

func (s *Store) newBatch(tx *bolt.Tx) *batch {
	meta := tx.Bucket(bucketMeta)
	return &batch{
		s: s, tx: tx,
		slots: tx.Bucket(bucketSlots), far: tx.Bucket(bucketFar), ids: tx.Bucket(bucketIDs),
		exch: tx.Bucket(bucketExchanges), meta: meta, countsBk: meta.Bucket(bucketCounts),
		slotB: map[int64]*bolt.Bucket{}, farB: map[int64]*bolt.Bucket{}, drained: map[int64]struct{}{},
		ex: map[exKey]*ExchangeDef{}, delta: map[uint64]int64{},
		incCounter: s.incCounter, nextSeq: s.persistedSeq,
		farMin: s.farMin, farMinOK: s.farMinOK,
	}
}

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
	info := CommitInfo{Requests: len(reqs), Duration: dur}
	if err != nil {
		err = commitError(err)
		info.Err = err
		for _, r := range reqs {
			if r.err == nil {
				r.err = err
			}
		}
	} else {
		s.publish(b)
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
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(info)
	}
	for _, r := range reqs {
		close(r.done)
	}
}

// commitError classifies a failed transaction.
func commitError(err error) error {
	switch {
	case errors.Is(err, berrors.ErrMaxSizeReached), errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w: %w", ErrFull, err)
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return ErrClosed
	}
	return fmt.Errorf("store: commit: %w", err)
}

// publish makes a committed batch visible in memory.
func (s *Store) publish(b *batch) {
	s.incCounter = b.incCounter
	s.persistedSeq = b.nextSeq
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
	s.farMin, s.farMinOK = b.farMin, b.farMinOK
	if s.scan != nil {
		s.scan.late = append(s.scan.late, b.late...)
	}
}

// exchange looks an exchange up through the batch overlay.
func (b *batch) exchange(k exKey) (ExchangeDef, bool) {
	if d, ok := b.ex[k]; ok {
		if d == nil {
			return ExchangeDef{}, false
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
		prefix := idPrefix([]byte(r.vhost), []byte(r.name), []byte(r.id))
		var keys []Key
		c := b.ids.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(k) == len(prefix)+KeySize {
				keys = append(keys, Key(k[len(prefix):]))
			}
		}
		d, known := b.exchange(exKey{r.vhost, r.name})
		for _, k := range keys {
			inc, found, err := b.remove(k)
			if err != nil {
				return err
			}
			if found && known && inc == d.Incarnation {
				r.n++
			}
		}
	case opPutExchange:
		d := r.def
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
		r.def = d
	case opCancelExchange, opDeleteExchange:
		k := exKey{r.vhost, r.name}
		d, ok := b.exchange(k)
		if !ok {
			r.err = fmt.Errorf("%w: %q in vhost %q", ErrUnknownExchange, r.name, r.vhost)
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
	k, ok := b.s.liveInc[inc]
	if !ok {
		return k, false
	}
	d, ok := b.exchange(k)
	return k, ok && d.Incarnation == inc
}

func (b *batch) slot(idx int64, create bool) (*bolt.Bucket, error) {
	if bk := b.slotB[idx]; bk != nil {
		return bk, nil
	}
	key := u64(uint64(idx))
	bk := b.slots.Bucket(key)
	if bk == nil {
		if !create {
			return nil, nil
		}
		var err error
		if bk, err = b.slots.CreateBucket(key); err != nil {
			return nil, err
		}
	}
	bk.FillPercent = 1 // appended in sequence order: pack pages full
	b.slotB[idx] = bk
	return bk, nil
}

func (b *batch) farBucket(idx int64, create bool) (*bolt.Bucket, error) {
	if bk := b.farB[idx]; bk != nil {
		return bk, nil
	}
	key := u64(uint64(idx))
	bk := b.far.Bucket(key)
	if bk == nil {
		if !create {
			return nil, nil
		}
		var err error
		if bk, err = b.far.CreateBucket(key); err != nil {
			return nil, err
		}
	}
	bk.FillPercent = 1 // appended in sequence order: pack pages full
	b.farB[idx] = bk
	return bk, nil
}

// put stores one message: into its slot when due before the watermark,
// otherwise appended to its far bucket.
func (b *batch) put(p *putItem) error {
	due := p.key.Due()
	var err error
	if due < b.s.watermark {
		var bk *bolt.Bucket
		if bk, err = b.slot(due/b.s.slotMs, true); err == nil {
			err = bk.Put(storedKey(p.key), p.val)
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
	b.puts++
	b.nextSeq = max(b.nextSeq, p.key.Seq()+1)
	return nil
}

// remove deletes one message and its ids entry, and returns the incarnation
// it was stored with.
func (b *batch) remove(k Key) (inc uint64, found bool, err error) {
	due := k.Due()
	fine := due < b.s.watermark
	var bk *bolt.Bucket
	if fine {
		bk, err = b.slot(due/b.s.slotMs, false)
	} else {
		bk, err = b.farBucket(due/b.s.farMs, false)
	}
	key := storedKey(k)
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
	inc = mv.incarnation
	var id []byte
	if mv.flags&flagMessageID != 0 {
		id = idKey(mv.vhost, mv.exchange, mv.messageID, k)
	}
	if err := c.Delete(); err != nil {
		return 0, false, err
	}
	if id != nil {
		if err := b.ids.Delete(id); err != nil {
			return 0, false, err
		}
	}
	if fine {
		b.drained[due/b.s.slotMs] = struct{}{}
	} else if due <= b.farMin {
		b.farMinOK = false
	}
	b.delta[inc]--
	b.deletes++
	return inc, true, nil
}

// finish drops drained slots and writes counters into meta.
func (b *batch) finish() error {
	for idx := range b.drained {
		bk, err := b.slot(idx, false)
		if err != nil {
			return err
		}
		if bk == nil {
			continue
		}
		if k, _ := bk.Cursor().First(); k == nil {
			if err := b.slots.DeleteBucket(u64(uint64(idx))); err != nil {
				return err
			}
			delete(b.slotB, idx)
		}
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
	if b.nextSeq != b.s.persistedSeq {
		if err := b.meta.Put(metaSeq, u64(b.nextSeq)); err != nil {
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

func compareKeys(a, b Key) int { return bytes.Compare(a[:], b[:]) }

// keyHeap is a max-heap of keys.
type keyHeap []Key

func (h keyHeap) Len() int           { return len(h) }
func (h keyHeap) Less(i, j int) bool { return compareKeys(h[i], h[j]) > 0 }
func (h keyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *keyHeap) Push(x any)        { *h = append(*h, x.(Key)) }
func (h *keyHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	*h = old[:len(old)-1]
	return k
}

// nextDueExact computes the earliest due over slots and far buckets. It runs
// in the writer between commits, so the two halves see the same state.
func (s *Store) nextDueExact() (int64, bool, error) {
	var due int64
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		due, ok = firstSlotDue(tx)
		if ok {
			return nil
		}
		if !s.farMinOK {
			s.mu.Lock()
			s.farMin = farMinimum(tx, s.watermark, s.farMs)
			s.farMinOK = true
			s.mu.Unlock()
		}
		due, ok = s.farMin, s.farMin != math.MaxInt64
		return nil
	})
	return due, ok, err
}

// firstSlotDue is the earliest due time in the first slot (a scan of one
// slot: its keys are in sequence order).
func firstSlotDue(tx *bolt.Tx) (int64, bool) {
	slots := tx.Bucket(bucketSlots)
	c := slots.Cursor()
	for sk, _ := c.First(); sk != nil; sk, _ = c.Next() {
		m, ok := int64(math.MaxInt64), false
		bc := slots.Bucket(sk).Cursor()
		for k, _ := bc.First(); k != nil; k, _ = bc.Next() {
			m, ok = min(m, storedDue(k)), true
		}
		if ok {
			return m, true
		}
	}
	return 0, false
}

// farMinimum scans far buckets in order for the earliest due at or after w
// (the first non-empty bucket decides). math.MaxInt64 when there is none.
func farMinimum(tx *bolt.Tx, w, farMs int64) int64 {
	far := tx.Bucket(bucketFar)
	c := far.Cursor()
	for fk, _ := c.Seek(u64(uint64(w / farMs))); fk != nil; fk, _ = c.Next() {
		m := int64(math.MaxInt64)
		bc := far.Bucket(fk).Cursor()
		for k, _ := bc.First(); k != nil; k, _ = bc.Next() {
			if d := storedDue(k); d >= w && d < m {
				m = d
			}
		}
		if m != math.MaxInt64 {
			return m
		}
	}
	return math.MaxInt64
}
