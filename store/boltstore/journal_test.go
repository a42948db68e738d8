package boltstore

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testwait"
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

// writeJournal appends one record per batch of items to a new journal of
// the store at path, in generation gen.
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
			flipByte(t, journalPath(path, 1), j.off-3)
		}},
		{name: "torn middle record", id: 1, gen: 5, want: a, mangle: func(t *testing.T, path string, j *journal) {
			flipByte(t, journalPath(path, 1), recordLen(t, journalPath(path, 1))+journalHeader)
		}},
		{name: "the next generation in the other file", id: 1, gen: 5, want: concat(a, b, c, b), mangle: func(t *testing.T, path string, j *journal) {
			appendGen(t, j, 6, b)
		}},
		{name: "the next generation, the one before checkpointed", id: 1, gen: 6, want: b, mangle: func(t *testing.T, path string, j *journal) {
			appendGen(t, j, 6, b)
		}},
		{name: "a generation written over the start of its file", id: 1, gen: 7, want: b, mangle: func(t *testing.T, path string, j *journal) {
			appendGen(t, j, 7, b)
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

// appendGen appends one record of items in generation gen, from the start
// of its file.
func appendGen(t *testing.T, j *journal, gen uint64, items []putItem) {
	t.Helper()
	j.restart(gen)
	if err := j.append([]*request{{kind: opPut, puts: items}}, len(items)); err != nil {
		t.Fatal(err)
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
	h.s.idleCheckpoint = 0 // keep them journaled for the copy below
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
	for i := range 2 {
		copyFile(t, journalPath(h.path, i), journalPath(crashed, i))
	}

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

// TestAnIdleJournalGoesIntoBbolt checks that Puts journaled and then left
// alone are checkpointed in the background once no request came for
// idleCheckpoint, so that the next Delete commits alone instead of
// carrying the burst's tail into bbolt first.
func TestAnIdleJournalGoesIntoBbolt(t *testing.T) {
	h := newHarness(t, Options{})
	x := h.exchange("/", "x")
	var keys []store.Key
	for i := range 20 {
		m := msg("x", base+int64(i)*1000, 0, "idle")
		m.Incarnation = x.Incarnation
		h.put(m)
		keys = append(keys, m.Key)
	}
	testwait.Until(t, 5*time.Second, "a checkpoint of the idle journal", func() bool { return h.s.Stats().Checkpoints == 1 })
	if got := bodies(t, h.s, keys); len(got) != 20 || got[19] != "idle" {
		t.Fatalf("bodies after the idle checkpoint: %q", got)
	}
	if err := h.s.Delete(context.Background(), keys[:5]...); err != nil {
		t.Fatal(err)
	}
	if st := h.s.Stats(); st.Checkpoints != 1 {
		t.Fatalf("Stats %+v: the Delete checkpointed again, want it alone", st)
	}
	if n := h.s.Pending(); n != 15 {
		t.Fatalf("Pending %d after deleting 5 of 20", n)
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
	j, err := openJournal(filepath.Join(f.TempDir(), "s"), 1, 3, false)
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

// TestReadsSeeEveryMessageWhileCheckpointsRun puts messages from many
// goroutines, enough for several background checkpoints, while a reader
// Gets every message confirmed so far and watches Pending: a message is
// never missing, in neither the journal nor bbolt, and Pending never goes
// back.
func TestReadsSeeEveryMessageWhileCheckpointsRun(t *testing.T) {
	h := newHarness(t, Options{NoSync: true})
	x := h.exchange("/", "x")
	const writers, each = 32, 1200 // 38,400 messages: three generations' checkpoints or more
	confirmed := make(chan store.Key, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				m := msg("x", base+int64((w*each+i)%86_400_000), 0, "b")
				m.Incarnation = x.Incarnation
				h.put(m)
				confirmed <- m.Key
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var seen []store.Key
	var last int64
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
	drain:
		for {
			select {
			case k := <-confirmed:
				seen = append(seen, k)
			default:
				break drain
			}
		}
		got, err := h.s.Get(seen)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range got {
			if m == nil {
				t.Fatalf("confirmed message %x missing (%d confirmed so far)", seen[i][:], len(seen))
			}
		}
		if p := h.s.Pending(); p < last || p < int64(len(seen)) {
			t.Fatalf("Pending %d after %d, with %d confirmed", p, last, len(seen))
		} else {
			last = p
		}
	}
	if st := h.s.Stats(); st.Checkpoints < 2 || h.s.Pending() != writers*each {
		t.Fatalf("Pending %d, Stats %+v: want %d and background checkpoints", h.s.Pending(), st, writers*each)
	}
}
