package scheduler

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// getLog is the real store, recording when (on the fake clock) each key was
// read; its first fails Get calls fail, as a database that went away does.
type getLog struct {
	Store
	clk *ManualClock

	mu    sync.Mutex // guards reads and fails
	reads map[store.Key][]int64
	fails int
}

var errReadFailed = errors.New("test: connection reset")

func (g *getLog) Get(keys []store.Key) ([]*store.Message, error) {
	now := g.clk.Now().UnixMilli()
	g.mu.Lock()
	if g.reads == nil {
		g.reads = map[store.Key][]int64{}
	}
	for _, k := range keys {
		g.reads[k] = append(g.reads[k], now)
	}
	fail := g.fails > 0
	g.fails--
	g.mu.Unlock()
	if fail {
		return nil, errReadFailed
	}
	return g.Store.Get(keys)
}

// readAt lists the fake times k was read at, relative to t0.
func (g *getLog) readAt(k store.Key) []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []int64
	for _, at := range g.reads[k] {
		out = append(out, at-t0)
	}
	return out
}

// readAheadHarness is a harness whose scheduler reads ahead by ra through
// a getLog.
func readAheadHarness(t *testing.T, ra time.Duration) (*harness, *getLog) {
	h := newHarness(t, Options{ReadAhead: ra})
	g := &getLog{Store: h.st, clk: h.clk}
	h.backend = g
	return h, g
}

// walk advances the fake clock a millisecond at a time to t0+toMs.
func (h *harness) walk(toMs int64) {
	h.t.Helper()
	for h.clk.Now().UnixMilli() < t0+toMs {
		h.advance(time.Millisecond)
	}
}

func TestReadAheadReadsBeforeDue(t *testing.T) {
	for _, ra := range []time.Duration{50 * time.Millisecond, 10 * time.Millisecond, 3 * time.Millisecond} {
		t.Run(ra.String(), func(t *testing.T) {
			h, g := readAheadHarness(t, ra)
			var msgs []*store.Message
			for due := int64(100); due <= 300; due += 7 {
				msgs = append(msgs, h.put(string(rune('A'+len(msgs))), due, 0))
			}
			h.start()
			h.walk(320)
			h.wantReleased(inReleaseOrder(msgs...)...)
			// One read per message, between ReadAhead and 4/5 of it before
			// its due time (a step is a fifth, at least a millisecond).
			raMs := ra.Milliseconds()
			latest := raMs - readAheadStep(raMs)
			for _, m := range msgs {
				at := g.readAt(m.Key)
				due := m.Key.Due() - t0
				if len(at) != 1 || at[0] < due-raMs || at[0] > due-latest {
					t.Errorf("message due at +%d read at %v, want once in [+%d, +%d]", due, at, due-raMs, due-latest)
				}
			}
		})
	}
}

// TestReadAheadKeepsReleaseOrder: a message published after another was
// read ahead, with a shorter delay or a higher priority, still goes first:
// reading ahead does not dispatch.
func TestReadAheadKeepsReleaseOrder(t *testing.T) {
	h, g := readAheadHarness(t, 50*time.Millisecond)
	h.start()
	a := h.put("a", 100, 0)
	h.walk(60)
	if at := g.readAt(a.Key); len(at) != 1 {
		t.Fatalf("a read at %v by +60, want once (read ahead)", at)
	}
	h.put("b", 70, 0)
	h.put("c", 100, 5)
	h.walk(101)
	h.wantReleased("b", "c", "a")
}

// TestReadAheadCancelled: a message cancelled after it was read ahead is
// not released.
func TestReadAheadCancelled(t *testing.T) {
	h, g := readAheadHarness(t, 50*time.Millisecond)
	h.start()
	a := h.put("a", 100, 0)
	h.put("b", 100, 0)
	h.walk(60)
	if at := g.readAt(a.Key); len(at) != 1 {
		t.Fatalf("a read at %v by +60, want once (read ahead)", at)
	}
	if err := h.st.Delete(t.Context(), a.Key); err != nil {
		t.Fatal(err)
	}
	h.s.Cancelled(a.Key)
	h.walk(150)
	h.wantReleased("b")
}

// TestReadAheadFailedIsReadAgain: a read ahead that failed is read again
// when the message is due, and the message goes out on time.
func TestReadAheadFailedIsReadAgain(t *testing.T) {
	h, g := readAheadHarness(t, 50*time.Millisecond)
	g.fails = 1
	h.start()
	a := h.put("a", 100, 0)
	h.walk(99)
	h.wantReleased()
	h.walk(100)
	h.wantReleased("a")
	if at := g.readAt(a.Key); !slices.Equal(at, []int64{at[0], 100}) || at[0] > 90 {
		t.Fatalf("a read at %v, want once ahead (failed) and again at +100", at)
	}
}
