package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/delayproxy/delayproxy/store"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

const (
	// schemaVersion 2 added the released bucket; Open upgrades a version 1
	// file by creating it.
	schemaVersion = 2
	storeMagic    = "delayproxy store"

	// maxDue bounds due times (year ~146 million) so that watermark
	// arithmetic never overflows.
	maxDue = int64(1) << 62

	defaultSlotWidth   = time.Second
	defaultFarWidth    = 24 * time.Hour
	defaultCascadeLead = time.Minute
	defaultMmapSize    = 1 << 30
	defaultMaxBatch    = 10000
	defaultLockTimeout = time.Second
	requestQueue       = 4096
)

var (
	bucketMeta      = []byte("meta")
	bucketCounts    = []byte("counts") // nested in meta
	bucketSlots     = []byte("slots")
	bucketFar       = []byte("far")
	bucketIDs       = []byte("ids")
	bucketExchanges = []byte("exchanges")
	bucketReleased  = []byte("released")

	metaMagic       = []byte("magic")
	metaVersion     = []byte("version")
	metaSlotWidth   = []byte("slot-ms")
	metaFarWidth    = []byte("far-ms")
	metaSeq         = []byte("seq")
	metaIncarnation = []byte("incarnation")
	metaWatermark   = []byte("watermark")
)

// exKey names a delayed exchange.
type exKey struct{ vhost, name string }

// Store is a durable timing wheel of delayed messages in one bbolt file.
// All methods are safe for concurrent use.
type Store struct {
	db       *bolt.DB
	path     string
	opts     Options
	slotMs   int64 // slot width in ms, as recorded in the file
	farMs    int64 // far bucket width in ms, as recorded in the file
	leadMs   int64
	maxBatch int
	passMax  int    // most messages per cascade pass (cascadePassMax; tests lower it)
	scanHook func() // tests: runs in the cascade scan goroutine before it scans

	nextSeq atomic.Uint64 // next sequence handed out to Put

	reqs chan *request // to the writer goroutine
	done chan struct{} // closed when the writer has exited

	// closeMu guards closed. Senders on reqs hold it for reading, so Close
	// never closes reqs under a sender.
	closeMu sync.RWMutex
	closed  bool

	// mu guards the in-memory copy of committed state below. Only the
	// writer goroutine changes it (under mu, after a successful commit), so
	// the writer itself may read it without mu.
	mu        sync.RWMutex
	exchanges map[exKey]store.ExchangeDef
	liveInc   map[uint64]exKey // incarnation -> exchange, live ones only
	counts    map[uint64]int64 // stored messages per incarnation (absent: 0)
	live      int64            // sum of counts of live incarnations
	stale     int64            // sum of counts of other incarnations
	watermark int64            // due < watermark: slots; due >= watermark: far buckets
	farMin    int64            // earliest due in far buckets (math.MaxInt64: none), when farMinOK
	farMinOK  bool

	// Writer-only state (no lock: touched by the writer goroutine alone).
	incCounter   uint64       // last incarnation handed out
	persistedSeq uint64       // next sequence as recorded in meta
	scan         *cascadeScan // cascade pass in progress
	// slotCounts holds, per slot with released messages, its entries and
	// released marks as last committed: it tells when a slot may be all
	// released, which two counting walks then prove before the drop.
	slotCounts map[int64]slotCount

	upgrade bool // Open: the file has an older schema (set by load)

	// statsMu guards stats.
	statsMu sync.Mutex
	stats   Stats
}

// Open creates the store at path, or opens it if it exists. A file that is
// not a delayproxy store fails with ErrNotStore, one written by a newer
// schema with ErrSchemaTooNew, one held by another process with ErrLocked.
// Open reads only metadata and the registry: its cost does not depend on
// the number of pending messages, except that after a crash bbolt rebuilds
// its freelist by walking every page (Close writes it; see the package doc).
func Open(path string, opts Options) (*Store, error) {
	o, err := opts.normalize()
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := create(path, o); err != nil {
			return nil, fmt.Errorf("store: create %s: %w", path, err)
		}
	case err != nil:
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	case st.IsDir():
		return nil, fmt.Errorf("%w: %s is a directory", ErrNotStore, path)
	case st.Size() == 0:
		return nil, fmt.Errorf("%w: %s is an empty file", ErrNotStore, path)
	}
	db, err := bolt.Open(path, 0o600, boltOptions(o))
	if err != nil {
		var pathErr *fs.PathError
		var errno syscall.Errno
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return nil, fmt.Errorf("%w: %s (waited %v)", ErrLocked, path, o.LockTimeout)
		case errors.As(err, &pathErr), errors.As(err, &errno):
			return nil, fmt.Errorf("store: open %s: %w", path, err)
		}
		// Anything else is bbolt refusing the content (bad magic, version,
		// checksum, size).
		return nil, fmt.Errorf("%w: %s: not a bbolt file (%v)", ErrNotStore, path, err)
	}
	s := &Store{
		db:        db,
		path:      path,
		opts:      o,
		leadMs:    o.CascadeLead.Milliseconds(),
		maxBatch:  o.MaxBatch,
		passMax:   cascadePassMax,
		reqs:      make(chan *request, requestQueue),
		done:      make(chan struct{}),
		exchanges: make(map[exKey]store.ExchangeDef),
		liveInc:   make(map[uint64]exKey),
		counts:    make(map[uint64]int64),

		slotCounts: make(map[int64]slotCount),
	}
	if err := db.View(s.load); err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: %s", err, path)
	}
	if s.upgrade {
		if err := db.Update(upgrade); err != nil {
			db.Close()
			return nil, fmt.Errorf("store: upgrade %s to schema %d: %w", path, schemaVersion, err)
		}
	}
	s.recount()
	go s.run()
	return s, nil
}

func (o Options) normalize() (Options, error) {
	if o.SlotWidth == 0 {
		o.SlotWidth = defaultSlotWidth
	}
	if o.FarWidth == 0 {
		o.FarWidth = defaultFarWidth
	}
	if o.CascadeLead == 0 {
		o.CascadeLead = defaultCascadeLead
	}
	if o.InitialMmapSize == 0 {
		o.InitialMmapSize = defaultMmapSize
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = defaultLockTimeout
	}
	switch {
	case o.SlotWidth < time.Millisecond || o.SlotWidth%time.Millisecond != 0:
		return o, fmt.Errorf("store: SlotWidth %v is not a whole number of milliseconds", o.SlotWidth)
	case o.FarWidth < o.SlotWidth || o.FarWidth%o.SlotWidth != 0:
		return o, fmt.Errorf("store: FarWidth %v is not a multiple of SlotWidth %v", o.FarWidth, o.SlotWidth)
	case o.CascadeLead < 0:
		return o, fmt.Errorf("store: negative CascadeLead %v", o.CascadeLead)
	}
	return o, nil
}

func boltOptions(o Options) *bolt.Options {
	return &bolt.Options{
		Timeout:         o.LockTimeout,
		NoFreelistSync:  !o.SyncFreelist,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: o.InitialMmapSize,
		NoSync:          o.NoSync,
		MaxSize:         o.MaxSize,
	}
}

// create initialises a new store in a temporary file and links it into
// place, so that a crash never leaves a half-initialised store at path and an
// empty bbolt file found at path is always someone else's.
func create(path string, o Options) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".creating-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	f.Close()
	os.Remove(tmp) // bbolt initialises only an empty or missing file; start from nothing
	defer os.Remove(tmp)
	bo := boltOptions(o)
	bo.NoSync = false
	db, err := bolt.Open(tmp, 0o600, bo)
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketSlots, bucketFar, bucketIDs, bucketExchanges, bucketReleased} {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if _, err := meta.CreateBucket(bucketCounts); err != nil {
			return err
		}
		for k, v := range map[string][]byte{
			string(metaMagic):       []byte(storeMagic),
			string(metaVersion):     u64(schemaVersion),
			string(metaSlotWidth):   u64(uint64(o.SlotWidth.Milliseconds())),
			string(metaFarWidth):    u64(uint64(o.FarWidth.Milliseconds())),
			string(metaSeq):         u64(1),
			string(metaIncarnation): u64(0),
			string(metaWatermark):   u64(0),
		} {
			if err := meta.Put([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// load reads metadata, registry and counters (never messages).
func (s *Store) load(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil || string(meta.Get(metaMagic)) != storeMagic {
		return fmt.Errorf("%w: no delayproxy metadata in bbolt file", ErrNotStore)
	}
	version, ok := metaU64(meta, metaVersion)
	switch {
	case !ok || version == 0:
		return fmt.Errorf("%w: bad schema version", ErrNotStore)
	case version > schemaVersion:
		return fmt.Errorf("%w: file has schema %d, this build reads up to %d", ErrSchemaTooNew, version, schemaVersion)
	}
	var vals [5]uint64
	for i, k := range [][]byte{metaSlotWidth, metaFarWidth, metaSeq, metaIncarnation, metaWatermark} {
		v, ok := metaU64(meta, k)
		if !ok {
			return fmt.Errorf("%w: meta key %q missing", ErrNotStore, k)
		}
		vals[i] = v
	}
	s.slotMs, s.farMs = int64(vals[0]), int64(vals[1])
	s.persistedSeq, s.incCounter, s.watermark = vals[2], vals[3], int64(vals[4])
	if s.slotMs <= 0 || s.farMs < s.slotMs || s.farMs%s.slotMs != 0 {
		return fmt.Errorf("%w: bad slot widths %d/%d ms", ErrNotStore, s.slotMs, s.farMs)
	}
	s.nextSeq.Store(s.persistedSeq)
	need := [][]byte{bucketSlots, bucketFar, bucketIDs, bucketExchanges}
	if version >= 2 {
		need = append(need, bucketReleased)
	}
	for _, name := range need {
		if tx.Bucket(name) == nil {
			return fmt.Errorf("%w: bucket %q missing", ErrNotStore, name)
		}
	}
	s.upgrade = version < schemaVersion
	counts := meta.Bucket(bucketCounts)
	if counts == nil {
		return fmt.Errorf("%w: counts missing", ErrNotStore)
	}
	if err := counts.ForEach(func(k, v []byte) error {
		if len(k) != 8 || len(v) != 8 {
			return fmt.Errorf("%w: bad count entry", errCorrupt)
		}
		s.counts[binary.BigEndian.Uint64(k)] = int64(binary.BigEndian.Uint64(v))
		return nil
	}); err != nil {
		return err
	}
	return tx.Bucket(bucketExchanges).ForEach(func(k, v []byte) error {
		d, err := decodeExchange(k, v)
		if err != nil {
			return err
		}
		s.exchanges[exKey{d.VHost, d.Name}] = d
		return nil
	})
}

// upgrade brings a version 1 file to the current schema: it adds the
// released bucket (empty: version 1 deleted released messages outright).
func upgrade(tx *bolt.Tx) error {
	if _, err := tx.CreateBucketIfNotExists(bucketReleased); err != nil {
		return err
	}
	return tx.Bucket(bucketMeta).Put(metaVersion, u64(schemaVersion))
}

func metaU64(b *bolt.Bucket, k []byte) (uint64, bool) {
	v := b.Get(k)
	if len(v) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

// recount rebuilds liveInc and the live/stale totals. Callers hold mu for
// writing (or own s exclusively).
func (s *Store) recount() {
	clear(s.liveInc)
	for k, d := range s.exchanges {
		s.liveInc[d.Incarnation] = k
	}
	s.live, s.stale = 0, 0
	for inc, n := range s.counts {
		if _, ok := s.liveInc[inc]; ok {
			s.live += n
		} else {
			s.stale += n
		}
	}
}

// Close waits for the requests already queued to be committed, writes
// bbolt's freelist (so that the next Open need not rebuild it) and closes
// the file. Calls after the first return ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return store.ErrClosed
	}
	s.closed = true
	close(s.reqs)
	s.closeMu.Unlock()
	<-s.done
	var err error
	if !s.opts.SyncFreelist {
		// Write bbolt's freelist once, so that the next Open loads it
		// instead of walking every page of the file to rebuild it.
		s.db.NoFreelistSync = false
		err = s.db.Update(func(*bolt.Tx) error { return nil })
	}
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) isClosed() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	return s.closed
}

// view runs fn in a read transaction, mapping a closed database to ErrClosed.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	err := s.db.View(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return store.ErrClosed
	}
	return err
}

// do hands r to the writer and waits for its commit. When ctx ends first, do
// returns ctx.Err() and r may or may not be committed.
func (s *Store) do(ctx context.Context, r *request) error {
	r.ctx = ctx
	r.done = make(chan struct{})
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return store.ErrClosed
	}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		s.closeMu.RUnlock()
		return ctx.Err()
	}
	s.closeMu.RUnlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		select {
		case <-r.done:
			return r.err
		default:
			return ctx.Err()
		}
	}
}

// Put stores msgs durably: it returns nil only after the commit holding
// them has been fsync'd (unless Options.NoSync). It sets each message's Key
// (from Due, Priority and a new sequence) and Incarnation (from the
// registry) before queueing; the caller must not touch msgs until Put
// returns. Concurrent Puts share commits: one writer goroutine commits
// together every request that arrived while the previous commit was in
// flight, and a caller waits only for the commit holding its messages.
//
// When ctx ends before the commit, Put returns ctx.Err() and says nothing
// about durability: the messages may or may not be stored. Any other error
// (unknown exchange, invalid message, disk full, I/O error, closed store)
// means none of msgs was stored.
func (s *Store) Put(ctx context.Context, msgs ...*store.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	items := make([]putItem, len(msgs))
	s.mu.RLock()
	for i, m := range msgs {
		d, ok := s.exchanges[exKey{m.VHost, m.Exchange}]
		if !ok {
			s.mu.RUnlock()
			return fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, m.Exchange, m.VHost)
		}
		items[i].inc = d.Incarnation
	}
	s.mu.RUnlock()
	for _, m := range msgs {
		if m.Due < 0 || m.Due >= maxDue {
			return fmt.Errorf("%w: due time %d ms out of range", store.ErrInvalidMessage, m.Due)
		}
	}
	seq := s.nextSeq.Add(uint64(len(msgs))) - uint64(len(msgs))
	for i, m := range msgs {
		m.Incarnation = items[i].inc
		m.Key = store.MakeKey(m.Due, m.Priority, seq+uint64(i))
		v := encodeMessage(m)
		if int64(len(v)) > bolt.MaxValueSize {
			return fmt.Errorf("%w: %d bytes encoded", store.ErrInvalidMessage, len(v))
		}
		items[i].key, items[i].val = m.Key, v
		if m.MessageID != "" {
			items[i].id = idKey([]byte(m.VHost), []byte(m.Exchange), []byte(m.MessageID), m.Key)
		}
	}
	return s.do(ctx, &request{kind: opPut, puts: items})
}

// Delete removes the messages with these keys in one group commit (the
// scheduler calls it once RabbitMQ confirmed their release). A missing key
// is not an error. A message in a slot is marked released, which rewrites
// no page of the slot; the slot goes with one DeleteBucket once all of it
// is released (see the package doc).
func (s *Store) Delete(ctx context.Context, keys ...store.Key) error {
	if len(keys) == 0 {
		return nil
	}
	return s.do(ctx, &request{kind: opDelete, keys: append([]store.Key(nil), keys...)})
}

// Cancel removes every stored message of the exchange with that message-id
// (found through the ids index) and returns how many of them were pending
// (stale ones are removed too but not counted).
func (s *Store) Cancel(ctx context.Context, vhost, exchange, messageID string) (int, error) {
	r := &request{kind: opCancelID, vhost: vhost, name: exchange, id: messageID}
	err := s.do(ctx, r)
	return int(r.n), err
}

// CancelKey removes one message and reports whether it was pending.
func (s *Store) CancelKey(ctx context.Context, key store.Key) (bool, error) {
	r := &request{kind: opCancelKey, keys: []store.Key{key}}
	err := s.do(ctx, r)
	return r.n > 0, err
}

// CancelExchange discards every pending message of an exchange and keeps the
// exchange: it gives the exchange a new incarnation, which makes the pending
// messages stale (see Stale) in O(1). It returns how many were pending.
func (s *Store) CancelExchange(ctx context.Context, vhost, exchange string) (int64, error) {
	r := &request{kind: opCancelExchange, vhost: vhost, name: exchange}
	err := s.do(ctx, r)
	return r.n, err
}

// PutExchange records a delayed exchange. A new exchange gets a fresh
// incarnation; an existing one keeps its incarnation and takes the other
// fields of def (the caller compares definitions before). def.Incarnation is
// set on success.
func (s *Store) PutExchange(ctx context.Context, def *store.ExchangeDef) error {
	r := &request{kind: opPutExchange, def: *def}
	r.def.Arguments = append([]byte(nil), def.Arguments...)
	if err := s.do(ctx, r); err != nil {
		return err
	}
	def.Incarnation = r.def.Incarnation
	return nil
}

// DeleteExchange removes an exchange from the registry. Its pending
// messages become stale and are discarded when the scheduler meets them. It
// returns how many were pending, or ErrUnknownExchange.
func (s *Store) DeleteExchange(ctx context.Context, vhost, name string) (int64, error) {
	r := &request{kind: opDeleteExchange, vhost: vhost, name: name}
	err := s.do(ctx, r)
	return r.n, err
}

// Exchange looks a delayed exchange up in the in-memory registry.
func (s *Store) Exchange(vhost, name string) (store.ExchangeDef, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{vhost, name}]
	d.Arguments = append([]byte(nil), d.Arguments...)
	return d, ok
}

// Exchanges lists the delayed exchanges in no particular order.
func (s *Store) Exchanges() []store.ExchangeDef {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]store.ExchangeDef, 0, len(s.exchanges))
	for _, d := range s.exchanges {
		d.Arguments = append([]byte(nil), d.Arguments...)
		out = append(out, d)
	}
	return out
}

// Stale reports whether m belongs to an exchange that was deleted or
// cancelled since m was stored. The scheduler deletes stale messages instead
// of releasing them.
func (s *Store) Stale(m *store.Message) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{m.VHost, m.Exchange}]
	return !ok || d.Incarnation != m.Incarnation
}

// Pending is the number of pending (not stale) messages, in O(1).
func (s *Store) Pending() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.live
}

// Count is the number of pending messages of one exchange, in O(1).
func (s *Store) Count(vhost, exchange string) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{vhost, exchange}]
	if !ok {
		return 0
	}
	return s.counts[d.Incarnation]
}

// Stats returns cumulative counters since Open.
func (s *Store) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	s.statsMu.Unlock()
	s.mu.RLock()
	st.Stale = s.stale
	s.mu.RUnlock()
	bs := s.db.Stats()
	st.PageWrites = uint64(bs.TxStats.GetWrite())
	return st
}

// slotKey is the key of a slot bucket: due / slot width, 8 B BE.
func (s *Store) slotKey(due int64) []byte { return u64(uint64(due / s.slotMs)) }

// farBucketKey is the key of a far bucket: due / far width, 8 B BE.
func (s *Store) farBucketKey(due int64) []byte { return u64(uint64(due / s.farMs)) }

// roundUp rounds t up to a slot boundary; t is capped at maxDue first, so
// the result never overflows and stays a slot boundary.
func (s *Store) roundUp(t int64) int64 {
	t = min(t, maxDue)
	return (t + s.slotMs - 1) / s.slotMs * s.slotMs
}

// readWatermark reads the watermark of tx's snapshot.
func readWatermark(tx *bolt.Tx) int64 {
	v, _ := metaU64(tx.Bucket(bucketMeta), metaWatermark)
	return int64(v)
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

var _ store.Store = (*Store)(nil)
