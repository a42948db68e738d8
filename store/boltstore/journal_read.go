package boltstore

import (
	"encoding/binary"
	"errors"
	"io"
	"os"

	"github.com/delayproxy/delayproxy/store"
)

// readJournal reads the journaled messages of the store at path that are
// not in bbolt yet (generation gen or later), in generation order, and
// returns the last generation read (0 when none). A missing file holds
// none.
func readJournal(path string, id, gen uint64) (last uint64, items []putItem, err error) {
	var gens [2]uint64
	var got [2][]putItem
	for i := range got {
		data, err := readJournalFile(journalPath(path, i))
		if err != nil {
			return 0, nil, err
		}
		gens[i], got[i] = decodeJournal(data, id)
	}
	if gens[1] < gens[0] {
		gens[0], gens[1], got[0], got[1] = gens[1], gens[0], got[1], got[0]
	}
	for i := range got {
		if gens[i] >= gen && len(got[i]) > 0 {
			last, items = gens[i], append(items, got[i]...)
		}
	}
	return last, items, nil
}

// readJournalFile reads one journal file (nil when it does not exist).
func readJournalFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, journalSize))
}

// decodeJournal decodes the records at the start of data written by the
// store with journal id id: those of the first record's generation, up to
// the first that fails.
func decodeJournal(data []byte, id uint64) (gen uint64, items []putItem) {
	for off, first := 0, true; ; first = false {
		g, its, n, err := decodeRecord(data[off:], id)
		if err != nil || (!first && g != gen) {
			return gen, items
		}
		gen = g
		items = append(items, its...)
		off += n
	}
}

// decodeRecord decodes the record at the start of b and returns its
// generation, its messages and its length.
func decodeRecord(b []byte, id uint64) (gen uint64, items []putItem, n int, err error) {
	if len(b) < journalHeader {
		return 0, nil, 0, errJournalRecord
	}
	length := binary.LittleEndian.Uint32(b[0:])
	if uint64(length) > uint64(len(b)-journalHeader) {
		return 0, nil, 0, errJournalRecord
	}
	n = journalHeader + int(length)
	if recordChecksum(id, b[8:n]) != binary.LittleEndian.Uint32(b[4:]) {
		return 0, nil, 0, errJournalRecord
	}
	gen = binary.LittleEndian.Uint64(b[8:])
	p := b[journalHeader:n]
	count, k := binary.Uvarint(p)
	if k <= 0 || count > uint64(len(p)/minItemBytes) {
		return 0, nil, 0, errJournalRecord
	}
	p = p[k:]
	items = make([]putItem, count)
	for i := range items {
		it := &items[i]
		if len(p) < store.KeySize {
			return 0, nil, 0, errJournalRecord
		}
		it.key = store.Key(p[:store.KeySize])
		p = p[store.KeySize:]
		if it.inc, k = binary.Uvarint(p); k <= 0 {
			return 0, nil, 0, errJournalRecord
		}
		p = p[k:]
		for _, field := range []*[]byte{&it.val, &it.id} {
			l, k := binary.Uvarint(p)
			if k <= 0 || l > uint64(len(p)-k) {
				return 0, nil, 0, errJournalRecord
			}
			if l > 0 {
				*field = append([]byte(nil), p[k:k+int(l)]...)
			}
			p = p[k+int(l):]
		}
		if len(it.val) == 0 {
			return 0, nil, 0, errJournalRecord
		}
	}
	if len(p) != 0 {
		return 0, nil, 0, errJournalRecord
	}
	return gen, items, n, nil
}
