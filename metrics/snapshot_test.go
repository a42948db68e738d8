package metrics

import (
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fixedBacklog is a Backlog reporting fixed values.
type fixedBacklog struct {
	n      int64
	oldest time.Duration
}

func (b fixedBacklog) Overdue() (int64, time.Duration) { return b.n, b.oldest }

func TestBacklogGauges(t *testing.T) {
	m := New()
	if s := m.Snapshot(); s.Overdue != 0 || s.OldestOverdue != 0 {
		t.Fatalf("without a backlog: Snapshot reports %d, %v", s.Overdue, s.OldestOverdue)
	}
	if err := m.RegisterBacklog(fixedBacklog{340, 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		"\ndelayproxy_overdue_messages 340\n",
		"\ndelayproxy_oldest_overdue_seconds 1.5\n",
		"# TYPE delayproxy_overdue_messages gauge",
		"# TYPE delayproxy_oldest_overdue_seconds gauge",
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	if s := m.Snapshot(); s.Overdue != 340 || s.OldestOverdue != 1500*time.Millisecond {
		t.Fatalf("Snapshot reports %d, %v; want 340, 1.5s", s.Overdue, s.OldestOverdue)
	}
	if err := m.RegisterBacklog(fixedBacklog{}); err == nil {
		t.Fatal("a second RegisterBacklog succeeded")
	}
}

func TestSnapshot(t *testing.T) {
	m := New()
	touch(m)
	m.Refused(RefusedForbidden)
	s := m.Snapshot()
	tests := []struct {
		name      string
		got, want float64
	}{
		{"stored", s.Stored, 7},
		{"released", s.Released, 4},
		{"refused (every reason)", s.Refused, 3},
		{"discarded", s.Discarded, 2},
		{"cancelled", s.Cancelled, 1},
		{"unroutable", s.Unroutable, 1},
		{"reconnects", s.UpstreamReconnects, 1},
		{"client connections", s.ClientConnections, 1},
		{"channels", s.Channels, 2},
		{"lateness count", float64(s.Lateness.Count), 1},
		{"lateness sum", s.Lateness.Sum, 0.003},
		{"lateness buckets", float64(len(s.Lateness.Bounds)), float64(len(LatenessBuckets))},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestLatenessQuantiles(t *testing.T) {
	// The same estimate as Prometheus's histogram_quantile over the
	// observations between two snapshots.
	m := New()
	m.ReleaseLateness(time.Hour) // before: not counted
	before := m.Snapshot().Lateness
	for range 90 {
		m.ReleaseLateness(700 * time.Microsecond) // in (0.5 ms, 1 ms]
	}
	for range 9 {
		m.ReleaseLateness(15 * time.Millisecond) // in (10 ms, 20 ms]
	}
	m.ReleaseLateness(2 * time.Hour) // above every bound
	h := m.Snapshot().Lateness.Sub(before)
	if h.Count != 100 {
		t.Fatalf("%d observations since before, want 100", h.Count)
	}
	tests := []struct {
		q    float64
		want float64
	}{
		{0.5, 0.0005 + 0.0005*50/90},
		{0.9, 0.001},
		{0.95, 0.01 + 0.01*5/9},
		{0.99, 0.02},
		{1, 3600}, // the highest bound
	}
	for _, tt := range tests {
		got, ok := h.Quantile(tt.q)
		if !ok || math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Quantile(%v) = %v, %v; want %v", tt.q, got, ok, tt.want)
		}
	}
	if _, ok := (Histogram{Bounds: LatenessBuckets, Counts: make([]uint64, len(LatenessBuckets))}).Quantile(0.5); ok {
		t.Error("Quantile of an empty histogram reported a value")
	}
}
