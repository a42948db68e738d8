package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// logRecorder is a slog.Handler that keeps the scheduler's progress lines.
type logRecorder struct {
	mu   sync.Mutex // guards recs
	recs []logRecord
}

type logRecord struct {
	msg   string
	attrs map[string]any
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "releases") {
		return nil
	}
	rec := logRecord{msg: r.Message, attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return nil
}

// take returns the lines logged since the last take.
func (l *logRecorder) take() []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	recs := l.recs
	l.recs = nil
	return recs
}

// logged is how many lines were logged since the last take.
func (l *logRecorder) logged() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recs)
}

// wantLine checks that exactly one line was logged since the last take, with
// that message and those attributes.
func wantLine(t *testing.T, l *logRecorder, msg string, attrs map[string]any) {
	t.Helper()
	recs := l.take()
	if len(recs) != 1 || recs[0].msg != msg {
		t.Fatalf("logged %+v, want one %q", recs, msg)
	}
	for k, want := range attrs {
		if got := recs[0].attrs[k]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%q: %s = %v, want %v (line %+v)", msg, k, got, want, recs[0].attrs)
		}
	}
}

func wantOverdue(t *testing.T, s *Scheduler, messages int64, oldest time.Duration) {
	t.Helper()
	if n, o := s.Overdue(); n != messages || o != oldest {
		t.Fatalf("Overdue() = %d, %v; want %d, %v", n, o, messages, oldest)
	}
}

func TestProgressOfARateLimitedBacklog(t *testing.T) {
	// 600 messages overdue by 54-60 s at 100/s (10 every 100 ms): the
	// backlog is measured every second, a line says releases are behind,
	// one after 5 s tells the progress, one says when they caught up.
	logs := &logRecorder{}
	h := newHarness(t, Options{Rate: 100, Logger: slog.New(logs)})
	var ids []string
	for i := range 600 {
		ids = append(ids, fmt.Sprintf("m%03d", i))
		h.put(ids[i], -60_000+int64(i)*10, 0)
	}
	h.start()
	h.settle()
	// The first 10 are in flight at the first measure.
	wantOverdue(t, h.s, 600, 59_900*time.Millisecond)
	wantLine(t, logs, "scheduler: releases behind, catching up", map[string]any{"overdue": 600, "oldest_late": 59_900 * time.Millisecond})
	for sec := 1; sec <= 5; sec++ {
		for range 10 {
			h.advance(100 * time.Millisecond)
		}
		// Measured after the second's first batch was handed over: the
		// released ones are gone, the batch in flight counts.
		left := 600 - 100*sec
		// Released at the rate, 100 a second, due 10 ms apart: the oldest
		// waiting stays 59.9 s late.
		wantOverdue(t, h.s, int64(left), 59_900*time.Millisecond)
		if sec < 5 {
			if recs := logs.take(); len(recs) != 0 {
				t.Fatalf("after %d s: logged %+v, want nothing before 5 s", sec, recs)
			}
		}
	}
	wantLine(t, logs, "scheduler: releases catching up", map[string]any{
		"released": 500, "remaining": 100, "rate_per_s": 100, "eta": time.Second,
	})
	for range 10 {
		h.advance(100 * time.Millisecond)
	}
	wantOverdue(t, h.s, 0, 0)
	wantLine(t, logs, "scheduler: releases caught up", map[string]any{"released": 600, "took": 6 * time.Second})
	h.wantReleased(ids...)
}

func TestOverdueCountsWhatIsHeldAndWhatIsOnDisk(t *testing.T) {
	// 1000 messages due from 10 minutes ago, at most 100 keys in memory,
	// releases blocked: a batch of 50 is in flight, 50 wait in the wheel
	// and 900 on disk. All of them count.
	logs := &logRecorder{}
	h := newHarness(t, Options{MaxLoaded: 100, BatchSize: 50, Logger: slog.New(logs)})
	h.rel.block = make(chan struct{})
	h.rel.entered = make(chan struct{}, 100)
	for i := range 1000 {
		h.put(fmt.Sprintf("m%04d", i), -600_000+int64(i)*100, 0)
	}
	h.start()
	select {
	case <-h.rel.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no release started")
	}
	// The oldest waiting is the first after the batch in flight.
	late := 600*time.Second - 50*100*time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	// The loop stores the measure, then logs the line.
	for logs.logged() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	wantOverdue(t, h.s, 1000, late)
	wantLine(t, logs, "scheduler: releases behind, catching up", map[string]any{"overdue": 1000, "oldest_late": late})

	close(h.rel.block)
	h.settle()
	h.advance(time.Second)
	wantOverdue(t, h.s, 0, 0)
	wantLine(t, logs, "scheduler: releases caught up", map[string]any{"released": 1000, "took": time.Second})
	if got := len(h.rel.released()); got != 1000 {
		t.Fatalf("released %d, want 1000", got)
	}
}

func TestNoProgressLinesWhileKeepingUp(t *testing.T) {
	// Messages released at their due time never wait: a measure counts at
	// most the one handed over at that instant (in flight), and nothing
	// is logged.
	logs := &logRecorder{}
	h := newHarness(t, Options{Logger: slog.New(logs)})
	h.start()
	for i := range 20 {
		h.put(fmt.Sprintf("m%02d", i), 500+int64(i)*100, 0)
	}
	for range 40 {
		h.advance(100 * time.Millisecond)
		if n, oldest := h.s.Overdue(); n > 1 || oldest != 0 {
			t.Fatalf("Overdue() = %d, %v; want at most the one in flight and none waiting", n, oldest)
		}
	}
	if got := len(h.rel.released()); got != 20 {
		t.Fatalf("released %d, want 20", got)
	}
	if recs := logs.take(); len(recs) != 0 {
		t.Fatalf("logged %+v, want nothing", recs)
	}
}

func TestBehindOnceTheOldestWaitingIsFiveSecondsLate(t *testing.T) {
	// Releases stall (RabbitMQ does not confirm): the messages behind the
	// batch in flight wait, and the line comes when the oldest of them is
	// 5 s late, not before.
	logs := &logRecorder{}
	h := newHarness(t, Options{BatchSize: 100, Logger: slog.New(logs)})
	h.rel.block = make(chan struct{})
	h.rel.entered = make(chan struct{}, 10)
	for i := range 300 {
		h.put(fmt.Sprintf("m%03d", i), 0, 0)
	}
	h.start()
	<-h.rel.entered
	measured := func(want time.Duration) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if n, late := h.s.Overdue(); n == 300 && late == want {
				return
			}
			if time.Now().After(deadline) {
				n, late := h.s.Overdue()
				t.Fatalf("Overdue() = %d, %v; want 300, %v", n, late, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for sec := 1; sec <= 4; sec++ {
		h.clk.Advance(time.Second)
		h.s.kick()
		measured(time.Duration(sec) * time.Second)
	}
	time.Sleep(10 * time.Millisecond) // a line logged late would show
	if recs := logs.take(); len(recs) != 0 {
		t.Fatalf("logged %+v before the oldest was 5 s late", recs)
	}
	h.clk.Advance(time.Second)
	h.s.kick()
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs.mu.Lock()
		n := len(logs.recs)
		logs.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	wantLine(t, logs, "scheduler: releases behind, catching up", map[string]any{"overdue": 300, "oldest_late": 5 * time.Second})
	close(h.rel.block)
	h.settle()
}
