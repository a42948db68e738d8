package boltstore

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// commitLog is a Metrics recording every commit.
type commitLog struct {
	mu    sync.Mutex // guards infos
	infos []store.CommitInfo
}

func (l *commitLog) Commit(ci store.CommitInfo) {
	l.mu.Lock()
	l.infos = append(l.infos, ci)
	l.mu.Unlock()
}

func TestGroupCommitSharesCommits(t *testing.T) {
	log := &commitLog{}
	h := newHarness(t, Options{Metrics: log})
	x := h.exchange("/", "x")
	before := h.s.Stats()
	const writers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				m := msg("x", base+int64(w*each+i), 0, "b")
				m.Incarnation = x.Incarnation
				if err := h.s.Put(context.Background(), m); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := h.s.Stats()
	commits, msgs := st.Commits-before.Commits, st.Messages-before.Messages
	if msgs != writers*each {
		t.Fatalf("Stats.Messages %d, want %d", msgs, writers*each)
	}
	if commits >= writers*each {
		t.Fatalf("%d commits for %d fsync'd Puts from %d goroutines: no group commit", commits, msgs, writers)
	}
	if st.MaxBatch < 2 || st.CommitTime <= 0 {
		t.Fatalf("Stats %+v: want MaxBatch > 1 and CommitTime > 0", st)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	sum := 0
	for _, ci := range log.infos {
		sum += ci.Messages
	}
	if sum != writers*each || uint64(len(log.infos)) != st.Commits {
		t.Fatalf("Metrics saw %d messages in %d commits; Stats %d commits", sum, len(log.infos), st.Commits)
	}
	t.Logf("%d Puts in %d commits (largest %d)", msgs, commits, st.MaxBatch)
}

func TestDiskFull(t *testing.T) {
	// MaxSize makes bbolt refuse to grow the file, as a full disk would.
	h := newHarness(t, Options{MaxSize: 1 << 20, InitialMmapSize: 1 << 20})
	// A checkpoint every 40 messages: the journal takes what bbolt would
	// not until one fails, then refuses like bbolt.
	h.s.journalMax = 40
	x := h.exchange("/", "x")
	ctx := context.Background()
	body := strings.Repeat("z", 8<<10)
	type result struct {
		m   *store.Message
		err error
	}
	var mu sync.Mutex // guards results
	var results []result
	for round := 0; round < 50; round++ {
		var wg sync.WaitGroup
		for i := range 8 {
			m := msg("x", base+int64(round*8+i)*60_000, 0, body)
			m.Incarnation = x.Incarnation
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := h.s.Put(ctx, m)
				mu.Lock()
				results = append(results, result{m, err})
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	var ok, full int
	for _, r := range results {
		got, err := h.s.Get([]store.Key{r.m.Key})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case r.err == nil:
			ok++
			if got[0] == nil || string(got[0].Body) != body {
				t.Fatalf("Put returned nil but message %x is missing", r.m.Key)
			}
		case errors.Is(r.err, store.ErrFull):
			full++
			if got[0] != nil {
				t.Fatalf("Put failed with %v but message %x is stored", r.err, r.m.Key)
			}
		default:
			t.Fatalf("Put: %v, want nil or ErrFull", r.err)
		}
	}
	if full == 0 || ok == 0 {
		t.Fatalf("%d stored, %d refused: want both", ok, full)
	}
	if st := h.s.Stats(); st.FailedCommits == 0 || h.s.Pending() != int64(ok) {
		t.Fatalf("FailedCommits %d, Pending %d, stored %d", st.FailedCommits, h.s.Pending(), ok)
	}
	h.check()
	// With room again (a bigger limit), writes work.
	h.opts.MaxSize = 0
	h.reopen()
	h.put(msg("x", base, 0, "after"))
	t.Logf("%d stored, %d refused with ErrFull", ok, full)
}

// TestDeletesMakeRoomWhileJournaledMessagesCannotGoIn fills bbolt until a
// journaled message no longer fits in it: the message stays journaled and
// readable, a Delete of messages in bbolt still commits (without the
// checkpoint that failed in the same commit), and once Deletes made room
// the checkpoint goes through.
func TestDeletesMakeRoomWhileJournaledMessagesCannotGoIn(t *testing.T) {
	h := newHarness(t, Options{MaxSize: 1 << 20, InitialMmapSize: 1 << 20})
	x := h.exchange("/", "x")
	ctx := context.Background()
	body := strings.Repeat("z", 8<<10)
	var inBolt []store.Key
	var stuck store.Key
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("1,000 messages of 8 KiB went into a 1 MiB file")
		}
		m := msg("x", base+int64(i)*60_000, 0, body)
		m.Incarnation = x.Incarnation
		h.put(m) // journaled
		err := h.s.settle()
		if errors.Is(err, store.ErrFull) {
			stuck = m.Key
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		inBolt = append(inBolt, m.Key)
	}
	if got := bodies(t, h.s, []store.Key{stuck}); got[0] != body {
		t.Fatal("the journaled message that does not fit in bbolt cannot be read")
	}
	if n := h.s.Pending(); n != int64(len(inBolt)+1) {
		t.Fatalf("Pending %d, want %d", n, len(inBolt)+1)
	}
	failed := h.s.Stats().FailedCommits
	half := inBolt[:len(inBolt)/2]
	if err := h.s.Delete(ctx, half...); err != nil {
		t.Fatalf("Delete of %d messages in bbolt while the journal cannot go in: %v", len(half), err)
	}
	if h.s.Stats().FailedCommits == failed {
		t.Fatal("the Delete's commit took the journaled message too: nothing was full")
	}
	if got, err := h.s.Get(half); err != nil || got[0] != nil || got[len(got)-1] != nil {
		t.Fatalf("deleted messages still there (%v)", err)
	}
	if err := h.s.settle(); err != nil {
		t.Fatalf("checkpoint after Deletes made room: %v", err)
	}
	if n := h.s.Pending(); n != int64(len(inBolt)-len(half)+1) {
		t.Fatalf("Pending %d, want %d", n, len(inBolt)-len(half)+1)
	}
	if got := bodies(t, h.s, []store.Key{stuck}); got[0] != body {
		t.Fatal("the journaled message is lost after its checkpoint")
	}
	t.Logf("%d messages in bbolt when the next one did not fit", len(inBolt))
}
