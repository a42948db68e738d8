package admin

import (
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// backlog is a metrics.Backlog with set values.
type backlog struct {
	n      int64
	oldest time.Duration
}

func (b backlog) Overdue() (int64, time.Duration) { return b.n, b.oldest }

func TestStatus(t *testing.T) {
	f := newFixture(t, "", nil)
	if err := f.m.RegisterBacklog(backlog{42, 7 * time.Second}); err != nil {
		t.Fatal(err)
	}
	srv := f.srv
	now := time.UnixMilli(1_700_000_000_000).UTC()
	srv.now = func() time.Time { return now }
	var st Status

	// One sample: no window, no series yet.
	srv.record()
	f.getJSON(t, "GET", "/api/status", 200, &st)
	if st.Window != nil || len(st.Series.Points) != 0 {
		t.Fatalf("after one sample: window %+v, %d points; want none", st.Window, len(st.Series.Points))
	}

	// 5 s: 10 stored, 4 released 1-2 ms late, 1 refused; 5 s more: 20
	// stored, 6 released 200 ms late, 2 connections on 3 channels.
	now = now.Add(5 * time.Second)
	f.m.Stored(10)
	for range 4 {
		f.m.ReleaseLateness(1500 * time.Microsecond)
	}
	f.m.Released(4)
	f.m.Refused(metrics.RefusedInvalidDelay)
	srv.record()
	now = now.Add(5 * time.Second)
	f.m.Stored(20)
	for range 6 {
		f.m.ReleaseLateness(150 * time.Millisecond)
	}
	f.m.Released(6)
	f.m.ConnOpened()
	f.m.ConnOpened()
	f.m.ChannelsOpened(3)
	srv.record()
	now = now.Add(time.Second) // between samples: totals are read now
	f.m.Discarded(2)
	f.getJSON(t, "GET", "/api/status", 200, &st)

	if st.Now != "2023-11-14T22:13:31.000Z" || st.NowMs != now.UnixMilli() {
		t.Errorf("now = %s %d", st.Now, st.NowMs)
	}
	want := Totals{Stored: 30, Released: 10, Refused: 1, Discarded: 2}
	if st.Totals != want {
		t.Errorf("totals = %+v, want %+v", st.Totals, want)
	}
	if st.Connections != (Connections{Clients: 2, Channels: 3}) {
		t.Errorf("connections = %+v", st.Connections)
	}
	rel := st.Releaser
	if rel.Overdue != 42 || rel.OldestOverdueSeconds != 7 || rel.Reconnects != 0 {
		t.Errorf("releaser = %+v", rel)
	}
	if strings.Join(rel.VHosts, ",") != "/,prod" {
		t.Errorf("vhosts = %q, want / and prod", rel.VHosts)
	}
	if len(rel.Nodes) != 1 || !rel.Nodes[0].Self || rel.Nodes[0].Releases != "all" {
		t.Errorf("nodes = %+v, want this node releasing all", rel.Nodes)
	}

	p50 := func(r Rates) float64 { return *r.LatenessP50 }
	p99 := func(r Rates) float64 { return *r.LatenessP99 }
	tests := []struct {
		name      string
		got, want float64
	}{
		{"points", float64(len(st.Series.Points)), 2},
		{"interval", st.Series.IntervalSeconds, 5},
		{"first stored/s", st.Series.Points[0].StoredPerSecond, 2},
		{"first released/s", st.Series.Points[0].ReleasedPerSecond, 0.8},
		{"first refused/s", st.Series.Points[0].RefusedPerSecond, 0.2},
		{"first releases", float64(st.Series.Points[0].Releases), 4},
		// All four in (1 ms, 2 ms]: interpolated as histogram_quantile does.
		{"first p50", p50(st.Series.Points[0]), 0.001 + 0.001*0.5},
		{"first p99", p99(st.Series.Points[0]), 0.001 + 0.001*0.99},
		{"second stored/s", st.Series.Points[1].StoredPerSecond, 4},
		{"second p50", p50(st.Series.Points[1]), 0.1 + 0.1*0.5},
		{"window seconds", st.Window.Seconds, 10},
		{"window stored/s", st.Window.StoredPerSecond, 3},
		{"window released/s", st.Window.ReleasedPerSecond, 1},
		{"window refused/s", st.Window.RefusedPerSecond, 0.1},
		{"window releases", float64(st.Window.Releases), 10},
		// 4 in (1 ms, 2 ms], 6 in (100 ms, 200 ms]: the median is the
		// first of the slower ones.
		{"window p50", p50(*st.Window), 0.1 + 0.1*(5-4)/6.0},
		{"window p99", p99(*st.Window), 0.1 + 0.1*(9.9-4)/6},
	}
	for _, tt := range tests {
		if math.Abs(tt.got-tt.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if st.Window.From != "2023-11-14T22:13:20.000Z" || st.Window.UntilMs != now.Add(-time.Second).UnixMilli() {
		t.Errorf("window from %s until %d", st.Window.From, st.Window.UntilMs)
	}
}

func TestStatusWithoutReleasesHasNoLateness(t *testing.T) {
	f := newFixture(t, "", nil)
	now := time.Now()
	f.srv.now = func() time.Time { return now }
	f.srv.record()
	now = now.Add(5 * time.Second)
	f.m.Stored(1)
	f.srv.record()
	var st map[string]any
	f.getJSON(t, "GET", "/api/status", 200, &st)
	w := st["window"].(map[string]any)
	if w["lateness_p50_seconds"] != nil || w["lateness_p99_seconds"] != nil || w["releases"] != 0.0 {
		t.Errorf("window without releases: %v", w)
	}
	if r := st["releaser"].(map[string]any); r["overdue"] != 0.0 {
		t.Errorf("releaser without a backlog registered: %v", r)
	}
}

func TestHistoryKeepsFiveMinutes(t *testing.T) {
	var h history
	start := time.Now()
	for i := range statusKeep + 10 {
		h.add(sample{at: start.Add(time.Duration(i) * statusEvery)})
	}
	got := h.all()
	if len(got) != statusKeep {
		t.Fatalf("%d samples kept, want %d", len(got), statusKeep)
	}
	if span := got[len(got)-1].at.Sub(got[0].at); span != 5*time.Minute {
		t.Errorf("samples span %v, want 5m", span)
	}
}

func TestStatusPageAssets(t *testing.T) {
	f := newFixture(t, testToken, nil)
	tests := []struct {
		method, path string
		code         int
		ctype        string
		contains     string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8", `<script src="/ui/status.js" defer>`},
		{"HEAD", "/", 200, "text/html; charset=utf-8", ""},
		{"GET", "/ui/status.js", 200, "text/javascript; charset=utf-8", "sessionStorage"},
		{"GET", "/ui/status.css", 200, "text/css; charset=utf-8", "prefers-color-scheme"},
		{"GET", "/ui/favicon.svg", 200, "image/svg+xml", "<svg"},
		{"GET", "/ui/", 404, "", ""}, // no listing
		{"GET", "/ui/index.html", 404, "", ""},
		{"GET", "/index.html", 404, "", ""},
		{"POST", "/", 405, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, f.http.URL+tt.path, nil)
			resp, err := f.http.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body strings.Builder
			_, _ = io.Copy(&body, resp.Body)
			if resp.StatusCode != tt.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.code)
			}
			if tt.code != 200 {
				return
			}
			h := resp.Header
			if h.Get("Content-Type") != tt.ctype {
				t.Errorf("Content-Type %q, want %q", h.Get("Content-Type"), tt.ctype)
			}
			if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
			if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
				t.Errorf("headers %v", h)
			}
			if !strings.Contains(body.String(), tt.contains) {
				t.Errorf("body lacks %q", tt.contains)
			}
		})
	}
	// The data stays behind the token.
	if code, _ := f.do(t, "GET", "/api/status", ""); code != 401 {
		t.Errorf("/api/status without the token: %d, want 401", code)
	}
	if code, _ := f.do(t, "GET", "/api/status", testToken); code != 200 {
		t.Errorf("/api/status with the token: %d, want 200", code)
	}
	if code, _ := f.do(t, "POST", "/api/status", testToken); code != 405 {
		t.Errorf("POST /api/status: %d, want 405", code)
	}
}

func TestStartSamplesAndShutdownStops(t *testing.T) {
	st := teststore.Open(t, "", boltstore.Options{NoSync: true})
	m := metrics.New()
	srv, err := New(Options{Addr: "127.0.0.1:0", Engine: st, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(srv.hist.all()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := len(srv.hist.all()); n != 1 {
		t.Errorf("%d samples after Start, want the first one", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(ctx); err != nil { // twice is harmless
		t.Fatal(err)
	}
	// goleak (TestMain) checks that the sampling goroutine is gone.
}
