package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	"github.com/delayproxy/delayproxy/store/storetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// touch exercises every method once so every series exists.
func touch(m *Metrics) {
	m.ConnOpened()
	m.ConnOpened()
	m.ConnClosed()
	m.ChannelsOpened(3)
	m.ChannelsOpened(-1)
	m.Relayed(true, 2, 100)
	m.Relayed(false, 5, 4000)
	m.Relayed(true, 1, 8)
	m.AcksFolded(6)
	m.AcksFolded(3)
	m.Stored(7)
	m.Released(4)
	m.Cancelled(1)
	m.Discarded(2)
	m.Unroutable(1)
	m.Refused(RefusedDelayTooLong)
	m.Refused(RefusedDelayTooLong)
	m.ReleaseLateness(3 * time.Millisecond)
	m.Commit(store.CommitInfo{Messages: 60, Deletes: 4, Duration: 2 * time.Millisecond})
	m.Commit(store.CommitInfo{Messages: 1, Err: store.ErrFull}) // not observed
	m.UpstreamReconnect()
	m.RolesHeld(3, 3)
	m.RolesHeld(0, 3)
	m.RolesHeld(2, 2)
}

func TestValues(t *testing.T) {
	m := New()
	touch(m)
	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"client_connections", testutil.ToFloat64(m.clientConns), 1},
		{"connections_opened_total", testutil.ToFloat64(m.connOpened), 2},
		{"connections_closed_total", testutil.ToFloat64(m.connClosed), 1},
		{"channels", testutil.ToFloat64(m.channels), 2},
		{"frames c2u", testutil.ToFloat64(m.frames[ClientToUpstream]), 3},
		{"bytes c2u", testutil.ToFloat64(m.bytes[ClientToUpstream]), 108},
		{"frames u2c", testutil.ToFloat64(m.frames[UpstreamToClient]), 5},
		{"bytes u2c", testutil.ToFloat64(m.bytes[UpstreamToClient]), 4000},
		{"acks folded", testutil.ToFloat64(m.acksFolded), 9},
		{"stored", testutil.ToFloat64(m.stored), 7},
		{"released", testutil.ToFloat64(m.released), 4},
		{"cancelled", testutil.ToFloat64(m.cancelled), 1},
		{"discarded", testutil.ToFloat64(m.discarded), 2},
		{"unroutable", testutil.ToFloat64(m.unroutable), 1},
		{"refused delay_too_long", testutil.ToFloat64(m.refused[RefusedDelayTooLong]), 2},
		{"refused store_error", testutil.ToFloat64(m.refused[RefusedStoreError]), 0},
		{"reconnects", testutil.ToFloat64(m.upstreamReconnects), 1},
		{"releaser_role", testutil.ToFloat64(m.role), 2},
		{"releaser_role_changes_total", testutil.ToFloat64(m.roleChanges), 8},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestLabels(t *testing.T) {
	m := New()
	m.Relayed(true, 2, 10)
	m.Relayed(false, 1, 20)
	want := `
# HELP delayproxy_relayed_frames_total AMQP frames relayed unchanged between clients and RabbitMQ.
# TYPE delayproxy_relayed_frames_total counter
delayproxy_relayed_frames_total{direction="client_to_upstream"} 2
delayproxy_relayed_frames_total{direction="upstream_to_client"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delayproxy_relayed_frames_total"); err != nil {
		t.Error(err)
	}
	// Every refuse reason exists from the start, at zero, so rate() works
	// before the first refusal.
	if n := testutil.CollectAndCount(m.Registry(), "delayproxy_messages_refused_total"); n != int(numRefuseReasons) {
		t.Errorf("refused series = %d, want %d", n, numRefuseReasons)
	}
}

func TestHistograms(t *testing.T) {
	m := New()
	m.ReleaseLateness(700 * time.Microsecond) // into the 1 ms bucket
	m.ReleaseLateness(2 * time.Hour)          // above every bucket
	m.Commit(store.CommitInfo{Messages: 1000, Duration: 3 * time.Millisecond})
	want := `
# HELP delayproxy_store_commit_batch_messages Messages written or deleted by one store group commit.
# TYPE delayproxy_store_commit_batch_messages histogram
delayproxy_store_commit_batch_messages_bucket{le="1"} 0
delayproxy_store_commit_batch_messages_bucket{le="2"} 0
delayproxy_store_commit_batch_messages_bucket{le="5"} 0
delayproxy_store_commit_batch_messages_bucket{le="10"} 0
delayproxy_store_commit_batch_messages_bucket{le="20"} 0
delayproxy_store_commit_batch_messages_bucket{le="50"} 0
delayproxy_store_commit_batch_messages_bucket{le="100"} 0
delayproxy_store_commit_batch_messages_bucket{le="200"} 0
delayproxy_store_commit_batch_messages_bucket{le="500"} 0
delayproxy_store_commit_batch_messages_bucket{le="1000"} 1
delayproxy_store_commit_batch_messages_bucket{le="2000"} 1
delayproxy_store_commit_batch_messages_bucket{le="5000"} 1
delayproxy_store_commit_batch_messages_bucket{le="10000"} 1
delayproxy_store_commit_batch_messages_bucket{le="+Inf"} 1
delayproxy_store_commit_batch_messages_sum 1000
delayproxy_store_commit_batch_messages_count 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delayproxy_store_commit_batch_messages"); err != nil {
		t.Error(err)
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "delayproxy_release_lateness_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != 2 {
			t.Errorf("lateness count = %d, want 2", h.GetSampleCount())
		}
		for _, b := range h.GetBucket() {
			var want uint64
			switch {
			case b.GetUpperBound() >= 7200:
				want = 2
			case b.GetUpperBound() >= 0.001:
				want = 1
			}
			if b.GetCumulativeCount() != want {
				t.Errorf("lateness bucket le=%v = %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
			}
		}
		return
	}
	t.Error("delayproxy_release_lateness_seconds not gathered")
}

func TestNilMetricsIsNoop(t *testing.T) {
	var m *Metrics
	touch(m) // must not panic
}

func TestLint(t *testing.T) {
	m := New()
	touch(m)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// The Go and process collectors are not ours to rename.
		if strings.HasPrefix(p.Metric, "delayproxy_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestStoreCollector(t *testing.T) {
	path := filepath.Join(t.TempDir(), "delayproxy.db")
	s := teststore.Open(t, path, boltstore.Options{NoSync: true})
	ctx := context.Background()
	for _, ex := range []store.ExchangeDef{
		{VHost: "/", Name: "orders", DelayedType: "direct", Durable: true},
		{VHost: "prod", Name: "mail", DelayedType: "topic", Durable: true},
	} {
		if err := s.PutExchange(ctx, &ex); err != nil {
			t.Fatalf("PutExchange: %v", err)
		}
	}
	due := time.Now().Add(time.Hour).UnixMilli()
	var msgs []*store.Message
	for i := range 3 {
		msgs = append(msgs, &store.Message{VHost: "/", Exchange: "orders", RoutingKey: "rk", Body: []byte("x"), Due: due + int64(i), Delay: 3600_000})
	}
	msgs = append(msgs, &store.Message{VHost: "prod", Exchange: "mail", Body: []byte("y"), Due: due + 5000, Delay: 3605_000})
	storetest.Put(t, s, msgs...)

	m := New()
	if err := m.RegisterStore(s, path); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP delayproxy_pending_messages Delayed messages stored and not yet released, per delayed exchange.
# TYPE delayproxy_pending_messages gauge
delayproxy_pending_messages{exchange="mail",vhost="prod"} 1
delayproxy_pending_messages{exchange="orders",vhost="/"} 3
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delayproxy_pending_messages"); err != nil {
		t.Error(err)
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			v := mm.GetGauge().GetValue() + mm.GetCounter().GetValue()
			key := mf.GetName()
			for _, l := range mm.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			found[key] = v
		}
	}
	if got, want := found["delayproxy_next_due_timestamp_seconds"], float64(due)/1e3; got != want {
		t.Errorf("next due = %v, want %v", got, want)
	}
	if found["delayproxy_store_file_bytes"] <= 0 {
		t.Errorf("delayproxy_store_file_bytes = %v, want > 0", found["delayproxy_store_file_bytes"])
	}
	if found["delayproxy_store_written_messages_total"] != 4 {
		t.Errorf("delayproxy_store_written_messages_total = %v, want 4", found["delayproxy_store_written_messages_total"])
	}
}

func TestHandlerServesNames(t *testing.T) {
	m := New()
	touch(m)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, name := range []string{
		"delayproxy_client_connections", "delayproxy_channels",
		"delayproxy_connections_opened_total", "delayproxy_connections_closed_total",
		"delayproxy_relayed_frames_total", "delayproxy_relayed_bytes_total",
		"delayproxy_acks_folded_total", "delayproxy_messages_stored_total", "delayproxy_messages_released_total",
		"delayproxy_messages_cancelled_total", "delayproxy_messages_discarded_total",
		"delayproxy_messages_unroutable_total", "delayproxy_messages_refused_total",
		"delayproxy_release_lateness_seconds_bucket", "delayproxy_store_commit_duration_seconds_bucket",
		"delayproxy_store_commit_batch_messages_bucket", "delayproxy_upstream_reconnects_total",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if !strings.Contains(string(body), "\n"+name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestStoreCollectorEmpty(t *testing.T) {
	s := teststore.Open(t, "", boltstore.Options{NoSync: true})
	if err := s.PutExchange(context.Background(), &store.ExchangeDef{VHost: "/", Name: "idle", DelayedType: "direct"}); err != nil {
		t.Fatal(err)
	}
	m := New()
	if err := m.RegisterStore(s, ""); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP delayproxy_pending_messages Delayed messages stored and not yet released, per delayed exchange.
# TYPE delayproxy_pending_messages gauge
delayproxy_pending_messages{exchange="idle",vhost="/"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "delayproxy_pending_messages"); err != nil {
		t.Error(err)
	}
	for name, want := range map[string]int{
		"delayproxy_next_due_timestamp_seconds":  0, // absent while nothing is stored
		"delayproxy_store_file_bytes":            0, // no path given
		"delayproxy_store_commits_total":         1,
		"delayproxy_store_journal_commits_total": 1,
		"delayproxy_store_checkpoints_total":     1,
	} {
		if n, err := testutil.GatherAndCount(m.Registry(), name); err != nil || n != want {
			t.Errorf("%s: %d series (%v), want %d", name, n, err, want)
		}
	}
}
