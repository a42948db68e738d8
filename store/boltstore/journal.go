package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"syscall"

	"github.com/delayproxy/delayproxy/store"
)

// The journal is a preallocated file beside the bbolt file (path
// "-journal"). A group commit of Puts alone is made durable by one record
// appended to it and one fdatasync, instead of a bbolt commit (two
// fdatasyncs and some twenty pages at random places); a checkpoint later
// writes the journaled messages into bbolt in one transaction. A record:
//
//	 0        4        8                16
//	+--------+--------+----------------+--------------------------+
//	| length | crc32c | generation     | payload (length bytes)   |
//	| u32 LE | u32 LE | u64 LE         |                          |
//	+--------+--------+----------------+--------------------------+
//
//	payload: count uvarint, then count times:
//	  Key (17 B) | incarnation uvarint | len uvarint | encoded message |
//	  len uvarint | ids key (empty without a message-id)
//
// The checksum (Castagnoli) covers the store's journal id (8 B BE, random,
// kept in meta), the generation and the payload, so that a record of
// another store or a torn record never passes. Every checkpoint commits,
// in its bbolt transaction, the generation the next records take
// (metaJournal): records of an older generation are in bbolt already.
// After a checkpoint the file is written again from the start; the first
// record whose checksum fails, or whose generation differs from the
// first record's, ends the journal.
const (
	journalHeader = 16
	// journalSize is the journal file's preallocated size: a commit that
	// would not fit, with what is journaled already, checkpoints instead.
	journalSize = 8 << 20
	// journalMaxMessages is the most messages journaled before a
	// checkpoint: it bounds the overlay's memory, the checkpoint's
	// transaction and the replay at Open.
	journalMaxMessages = 16384
	// minItemBytes is the least payload a message takes in a record: it
	// bounds a record's count before anything is allocated for it.
	minItemBytes = store.KeySize + 3
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// newJournalID is a new store's journal id: random, so that a journal
// left beside a store file that was replaced never replays into it.
func newJournalID() uint64 { return rand.Uint64() }

// errJournalRecord: a record that does not decode; it ends the journal.
var errJournalRecord = errors.New("store: journal record does not decode")

// journal appends records to the journal file. Only the writer goroutine
// uses it.
type journal struct {
	f *os.File
	// size is the file's allocated size: journalSize, or 0 when the disk
	// had no room for it (then every commit goes to bbolt; the journal is
	// still read and checkpointed at Open).
	size int64
	id   uint64 // the store's journal id (meta)
	gen  uint64 // generation of the records appended now
	off  int64  // where the next record goes
	buf  []byte // the record being encoded, reused
	// sync makes every append durable (false only with Options.NoSync).
	sync bool
}

// openJournal opens (or creates) the journal file and makes sure it is
// allocated to its full size, so that an append's fdatasync writes data
// only, never the file's size. A disk without room for it gives a journal
// that takes nothing (size 0).
func openJournal(path string, id, gen uint64, sync bool) (*journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	j := &journal{f: f, size: journalSize, id: id, gen: gen, sync: sync}
	if err := preallocate(f, journalSize); errors.Is(err, syscall.ENOSPC) {
		j.size = 0
	} else if err != nil {
		f.Close()
		return nil, fmt.Errorf("store: allocate journal %s: %w", path, err)
	}
	return j, nil
}

// fits reports whether a record of n payload bytes fits after what is
// journaled.
func (j *journal) fits(n int) bool {
	return j.off+journalHeader+int64(n) <= j.size
}

// recordBytes is an upper bound of the payload bytes of items.
func recordBytes(items []putItem) int {
	n := binary.MaxVarintLen64
	for i := range items {
		n += store.KeySize + 3*binary.MaxVarintLen64 + len(items[i].val) + len(items[i].id)
	}
	return n
}

// append writes one record holding the puts of reqs and, unless NoSync,
// fdatasyncs it. On error nothing is known of the record's fate: the
// writer then checkpoints, which moves to the next generation and so
// discards it.
func (j *journal) append(reqs []*request, count int) error {
	b := append(j.buf[:0], make([]byte, journalHeader)...)
	b = binary.AppendUvarint(b, uint64(count))
	for _, r := range reqs {
		for i := range r.puts {
			p := &r.puts[i]
			b = append(b, p.key[:]...)
			b = binary.AppendUvarint(b, p.inc)
			b = binary.AppendUvarint(b, uint64(len(p.val)))
			b = append(b, p.val...)
			b = binary.AppendUvarint(b, uint64(len(p.id)))
			b = append(b, p.id...)
		}
	}
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)-journalHeader))
	binary.LittleEndian.PutUint64(b[8:], j.gen)
	binary.LittleEndian.PutUint32(b[4:], recordChecksum(j.id, b[8:]))
	j.buf = b
	if _, err := j.f.WriteAt(b, j.off); err != nil {
		return err
	}
	if j.sync {
		if err := datasync(j.f); err != nil {
			return err
		}
	}
	j.off += int64(len(b))
	return nil
}

// restart begins generation gen at the start of the file, once a
// checkpoint has committed every record before it.
func (j *journal) restart(gen uint64) {
	j.gen, j.off = gen, 0
}

func (j *journal) close() error { return j.f.Close() }

// recordChecksum is the checksum of a record: the journal id, then the
// generation and payload (rest, from offset 8 of the record).
func recordChecksum(id uint64, rest []byte) uint32 {
	var idb [8]byte
	binary.BigEndian.PutUint64(idb[:], id)
	return crc32.Update(crc32.Checksum(idb[:], castagnoli), castagnoli, rest)
}
