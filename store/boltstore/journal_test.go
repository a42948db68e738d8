package boltstore

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// journalItems are n put items with message-ids on every other one.
func journalItems(n int, seq uint64) []putItem {
	items := make([]putItem, n)
	for i := range items {
		m := msg("x", base+int64(i)*1000, uint8(i%3), "body")
		m.Key = store.MakeKey(m.Due, m.Priority, seq+uint64(i))
		items[i] = putItem{key: m.Key, val: encodeMessage(m), inc: 7}
		if i%2 == 0 {
			items[i].id = idKey([]byte("/"), []byte("x"), []byte("id"), m.Key)
		}
	}
	return items
}

// writeJournal appends one record per batch of items to a new journal at
// path, in generation gen.
func writeJournal(t *testing.T, path string, id, gen uint64, batches ...[]putItem) *journal {
	t.Helper()
	j, err := openJournal(path, id, gen, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.close() })
	for _, items := range batches {
		if err := j.append([]*request{{kind: opPut, puts: items}}, len(items)); err != nil {
			t.Fatal(err)
		}
	}
	return j
}

func TestJournalReplaysItsGenerationUpToTheFirstBadRecord(t *testing.T) {
	a, b, c := journalItems(3, 10), journalItems(1, 20), journalItems(4, 30)
	for _, tc := range []struct {
		name    string
		id, gen uint64 // what meta says
		mangle  func(t *testing.T, path string, j *journal)
		want    []putItem
	}{
		{name: "all records", id: 1, gen: 5, want: concat(a, b, c)},
		{name: "another store's journal", id: 2, gen: 5},
		{name: "checkpointed already", id: 1, gen: 6},
		{name: "torn last record", id: 1, gen: 5, want: concat(a, b), mangle: func(t *testing.T, path string, j *journal) {
			flipByte(t, path, j.off-3)
		}},
		{name: "torn middle record", id: 1, gen: 5, want: a, mangle: func(t *testing.T, path string, j *journal) {
			flipByte(t, path, recordLen(t, path)+journalHeader)
		}},
		{name: "next generation written over the start", id: 1, gen: 6, want: b, mangle: func(t *testing.T, path string, j *journal) {
			j.restart(6)
			if err := j.append([]*request{{kind: opPut, puts: b}}, len(b)); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "j")
			j := writeJournal(t, path, 1, 5, a, b, c)
			if tc.mangle != nil {
				tc.mangle(t, path, j)
			}
			_, got, err := readJournal(path, tc.id, tc.gen)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) || (len(got) > 0 && !reflect.DeepEqual(got, tc.want)) {
				t.Fatalf("replayed %d messages, want %d", len(got), len(tc.want))
			}
		})
	}
}

func concat(batches ...[]putItem) []putItem {
	var out []putItem
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// recordLen is the length of the journal's first record.
func recordLen(t *testing.T, path string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, _, n, err := decodeRecord(data, 1)
	if err != nil {
		t.Fatal(err)
	}
	return int64(n)
}

// TestJournaledPutsSurviveWithoutACheckpoint stores messages that stay in
// the journal (no checkpoint: the store is abandoned, as a crash would),
// and finds them all after Open, in bbolt, with their ids and counts.
func TestJournaledPutsSurviveWithoutACheckpoint(t *testing.T) {
	h := newHarness(t, Options{})
	x := h.exchange("/", "x")
	var keys []store.Key
	for i := range 50 {
		m := msg("x", base+int64(i)*7_000, 0, "journaled")
		m.Incarnation, m.MessageID = x.Incarnation, "id"
		h.put(m)
		keys = append(keys, m.Key)
	}
	if st := h.s.Stats(); st.JournalCommits == 0 || st.Checkpoints != 0 {
		t.Fatalf("Stats %+v: want the Puts journaled, no checkpoint yet", st)
	}
	// What Close would checkpoint is left in the journal: copy both files
	// as they are now, as a crash leaves them.
	crashed := filepath.Join(t.TempDir(), "crashed.db")
	copyFile(t, h.path, crashed)
	copyFile(t, journalPath(h.path), journalPath(crashed))

	s, err := Open(crashed, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := s.Stats(); st.Checkpoints != 1 {
		t.Fatalf("Open made %d checkpoints, want 1 (the replay)", st.Checkpoints)
	}
	if n := s.Pending(); n != 50 {
		t.Fatalf("Pending %d after replay, want 50", n)
	}
	if got := bodies(t, s, keys); len(got) != 50 || got[49] != "journaled" {
		t.Fatalf("replayed bodies %q", got)
	}
	removed, err := s.Cancel(context.Background(), "/", "x", "id")
	if err != nil || len(removed) != 50 {
		t.Fatalf("Cancel by id after replay removed %d (%v), want 50", len(removed), err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeJournal(f *testing.F) {
	dir := f.TempDir()
	j, err := openJournal(filepath.Join(dir, "j"), 1, 3, false)
	if err != nil {
		f.Fatal(err)
	}
	for _, items := range [][]putItem{journalItems(2, 1), journalItems(1, 5)} {
		if err := j.append([]*request{{kind: opPut, puts: items}}, len(items)); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(j.buf)
	j.close()
	f.Add([]byte{})
	f.Add(make([]byte, journalHeader))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, items := decodeJournal(data, 1)
		if len(items) > len(data)/minItemBytes {
			t.Fatalf("%d messages from %d bytes", len(items), len(data))
		}
		for _, it := range items {
			if len(it.val) == 0 {
				t.Fatal("a message without its value")
			}
		}
	})
}
