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

// The journal is two preallocated files beside the bbolt file (path
// "-journal0" and "-journal1"). A group commit of Puts alone is made
// durable by one record appended to one of them and one fdatasync, instead
// of a bbolt commit (two fdatasyncs and some twenty pages at random
// places); a checkpoint later writes the journaled messages into bbolt in
// one transaction. Generation g is appended to file g%2 from its start,
// so that a checkpoint can write one generation into bbolt while the next
// is appended to the other file. A record:
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
// in its bbolt transaction, the first generation it did not write
// (metaJournal): records of an older generation are in bbolt already. In
// each file the first record whose checksum fails, or whose generation
// differs from the file's first record's, ends what the file holds; Open
// replays the files' generations not yet in bbolt, older first.
const (
	journalHeader = 16
	// journalSize is each journal file's preallocated size: a generation
	// that would outgrow it is checkpointed first.
	journalSize = 8 << 20
	// journalMaxMessages is the most messages a generation takes: it
	// bounds the overlays' memory, a checkpoint's transaction and the
	// replay at Open.
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

// journal appends records to the journal's two files: generation g to
// file g%2, from its start, so that a checkpoint can write one generation
// into bbolt while the next is appended. Only the writer goroutine uses it.
type journal struct {
	files [2]*os.File
	// size is each file's allocated size: journalSize, or 0 when the disk
	// had no room for them (then every commit goes to bbolt; the journal
	// is still read and checkpointed at Open).
	size int64
	id   uint64 // the store's journal id (meta)
	gen  uint64 // generation of the records appended now
	off  int64  // where the next record goes
	buf  []byte // the record being encoded, reused
	// sync makes every append durable (false only with Options.NoSync).
	sync bool
}

// journalPath is the path of journal file i (0 or 1) of the store at
// path.
func journalPath(path string, i int) string { return fmt.Sprintf("%s-journal%d", path, i) }

// openJournal opens (or creates) the journal files of the store at path
// and makes sure they are allocated to their full size, so that an
// append's fdatasync writes data only, never a file's size. A disk without
// room for them gives a journal that takes nothing (size 0).
func openJournal(path string, id, gen uint64, sync bool) (*journal, error) {
	j := &journal{size: journalSize, id: id, gen: gen, sync: sync}
	for i := range j.files {
		p := journalPath(path, i)
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			j.files[i] = f
			err = preallocate(f, journalSize)
		}
		if errors.Is(err, syscall.ENOSPC) {
			j.size = 0
		} else if err != nil {
			j.close()
			return nil, fmt.Errorf("store: allocate journal %s: %w", p, err)
		}
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
	f := j.files[j.gen%2]
	if _, err := f.WriteAt(b, j.off); err != nil {
		return err
	}
	if j.sync {
		if err := datasync(f); err != nil {
			return err
		}
	}
	j.off += int64(len(b))
	return nil
}

// restart begins generation gen at the start of its file, whose last
// generation (gen-2) a checkpoint has committed.
func (j *journal) restart(gen uint64) {
	j.gen, j.off = gen, 0
}

func (j *journal) close() error {
	var err error
	for _, f := range j.files {
		if f != nil {
			err = errors.Join(err, f.Close())
		}
	}
	return err
}

// recordChecksum is the checksum of a record: the journal id, then the
// generation and payload (rest, from offset 8 of the record).
func recordChecksum(id uint64, rest []byte) uint32 {
	var idb [8]byte
	binary.BigEndian.PutUint64(idb[:], id)
	return crc32.Update(crc32.Checksum(idb[:], castagnoli), castagnoli, rest)
}
