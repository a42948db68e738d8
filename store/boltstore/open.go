package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/delayproxy/delayproxy/store"
)

// Errors of Open, besides the contract's (package store). Callers match
// them with errors.Is.
var (
	// ErrNotStore: the file exists but is not a delayproxy store.
	ErrNotStore = errors.New("store: not a delayproxy store")
	// ErrSchemaTooNew: the file was written by a newer delayproxy.
	ErrSchemaTooNew = errors.New("store: schema version is newer than this delayproxy")
	// ErrLocked: another process holds the store file open.
	ErrLocked = errors.New("store: file is locked by another process")
)

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
		db:             db,
		path:           path,
		opts:           o,
		leadMs:         o.CascadeLead.Milliseconds(),
		maxBatch:       o.MaxBatch,
		passMax:        cascadePassMax,
		journalMax:     journalMaxMessages,
		idsGoneMax:     maxIDsGone,
		idleCheckpoint: idleCheckpointAfter,
		reqs:           make(chan *request, requestQueue),
		done:           make(chan struct{}),
		exchanges:      make(map[exKey]store.ExchangeDef),
		counts:         make(map[uint64]int64),
		tally:          make(map[int64]*tallyRow),
		ov:             newOverlays(),

		slotCounts: make(map[int64]slotCount),
	}
	if err := db.View(s.load); err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: %s", err, path)
	}
	if s.fileVersion < schemaVersion {
		if err := db.Update(s.upgradeSchema); err != nil {
			db.Close()
			return nil, fmt.Errorf("store: upgrade %s to schema %d: %w", path, schemaVersion, err)
		}
	}
	s.recount()
	if err := s.openJournal(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	go s.run()
	return s, nil
}

// openJournal opens the journal and replays what it holds beyond bbolt:
// the messages of Puts that returned nil before a crash or a failed
// checkpoint. They are checkpointed into bbolt before Open returns.
func (s *Store) openJournal() error {
	var id, gen uint64
	if err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(metaJournal)
		if len(v) != 16 {
			return fmt.Errorf("%w: bad journal entry in meta", errCorrupt)
		}
		id, gen = beUint64(v), beUint64(v[8:])
		return nil
	}); err != nil {
		return err
	}
	recordGen, items, err := readJournal(s.path, id, gen)
	if err != nil {
		return fmt.Errorf("read journal: %w", err)
	}
	if s.jr, err = openJournal(s.path, id, gen, !s.opts.NoSync); err != nil {
		return err
	}
	if s.jr.size == 0 {
		s.opts.Logger.Warn("store: no room on the disk for the journal: every Put commits to bbolt directly until the next start",
			"journal", journalPath(s.path, 0), "needs", 2*journalSize)
	}
	if len(items) == 0 {
		return nil
	}
	s.jr.gen = recordGen
	s.ov.active.add(items, s.isLive)
	next := s.persistedSeq
	for i := range items {
		next = max(next, items[i].key.Seq()+1)
	}
	s.nextSeq.Store(next)
	// Without room in bbolt the messages stay journaled, as before.
	if err := s.checkpoint(); err != nil && !errors.Is(err, store.ErrFull) {
		s.jr.close()
		return fmt.Errorf("replay journal: %w", err)
	}
	return nil
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
		for _, name := range [][]byte{bucketSlots, bucketFar, bucketIDs, bucketExchanges, bucketReleased, bucketIDsGone} {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		for _, name := range [][]byte{bucketCounts, bucketTally} {
			if _, err := meta.CreateBucket(name); err != nil {
				return err
			}
		}
		for k, v := range map[string][]byte{
			string(metaMagic):       []byte(storeMagic),
			string(metaVersion):     u64(schemaVersion),
			string(metaSlotWidth):   u64(uint64(o.SlotWidth.Milliseconds())),
			string(metaFarWidth):    u64(uint64(o.FarWidth.Milliseconds())),
			string(metaSeq):         u64(1),
			string(metaIncarnation): u64(0),
			string(metaWatermark):   u64(0),
			string(metaJournal):     journalMeta(newJournalID(), 1),
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
	s.fileVersion = version
	if version >= 6 {
		gone := tx.Bucket(bucketIDsGone)
		if gone == nil {
			return fmt.Errorf("%w: bucket %q missing", ErrNotStore, bucketIDsGone)
		}
		c := gone.Cursor()
		if first, _ := c.First(); first != nil {
			last, _ := c.Last()
			if len(first) != 8 || len(last) != 8 {
				return fmt.Errorf("%w: bad ids-gone key", errCorrupt)
			}
			s.goneFirst, s.goneNext = beUint64(first), beUint64(last)+1
		}
	}
	if version >= 3 {
		bk := meta.Bucket(bucketTally)
		if bk == nil {
			return fmt.Errorf("%w: tally missing", ErrNotStore)
		}
		var err error
		if s.tally, err = loadTally(bk); err != nil {
			return err
		}
	}
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

// upgradeSchema brings an older file to the current schema: it adds the
// ids-gone bucket (versions 1 to 5 deleted ids entries at once, so it
// starts empty), gives it a journal id (versions 1 to 4 had no journal;
// a version 5 journal is kept, it may hold records), adds the released bucket
// (version 1 deleted released messages outright, so it starts empty) and
// the tally, counted from every key of the file once (versions 1 and 2
// kept none), and puts the epoch first in the ids index's keys (versions 1
// to 3).
func (s *Store) upgradeSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if _, err := tx.CreateBucketIfNotExists(bucketIDsGone); err != nil {
		return err
	}
	if s.fileVersion >= 5 { // its journal may hold records: keep it
		return meta.Put(metaVersion, u64(schemaVersion))
	}
	if err := meta.Put(metaJournal, journalMeta(newJournalID(), 1)); err != nil {
		return err
	}
	if s.fileVersion >= 4 {
		return meta.Put(metaVersion, u64(schemaVersion))
	}
	if err := upgradeIDs(tx); err != nil {
		return err
	}
	if s.fileVersion >= 3 {
		return meta.Put(metaVersion, u64(schemaVersion))
	}
	if _, err := tx.CreateBucketIfNotExists(bucketReleased); err != nil {
		return err
	}
	if meta.Bucket(bucketTally) != nil {
		if err := meta.DeleteBucket(bucketTally); err != nil {
			return err
		}
	}
	bk, err := meta.CreateBucket(bucketTally)
	if err != nil {
		return err
	}
	s.tally = s.countTally(tx)
	for hour, row := range s.tally {
		if err := bk.Put(u64(uint64(hour)), row.encode()); err != nil {
			return err
		}
	}
	return meta.Put(metaVersion, u64(schemaVersion))
}

// upgradeIDs rewrites the ids index of a version 1 to 3 file, whose keys
// lack the leading epoch: it reads them all, then writes the new keys in
// order, so the new index is built by appends.
func upgradeIDs(tx *bolt.Tx) error {
	old := tx.Bucket(bucketIDs)
	var keys [][]byte
	if err := old.ForEach(func(k, _ []byte) error {
		if len(k) < store.KeySize {
			return fmt.Errorf("%w: ids key %x", errCorrupt, k)
		}
		nk := make([]byte, idEpochSize, idEpochSize+len(k))
		binary.BigEndian.PutUint64(nk, idEpoch(store.Key(k[len(k)-store.KeySize:])))
		keys = append(keys, append(nk, k...))
		return nil
	}); err != nil {
		return err
	}
	slices.SortFunc(keys, bytes.Compare)
	if err := tx.DeleteBucket(bucketIDs); err != nil {
		return err
	}
	bk, err := tx.CreateBucket(bucketIDs)
	if err != nil {
		return err
	}
	bk.FillPercent = 1 // appends only
	for _, k := range keys {
		if err := bk.Put(k, nil); err != nil {
			return err
		}
	}
	return nil
}
