package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/testpaging"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// End-to-end tests of the operator's side of a running proxy against the
// real RabbitMQ: metrics that move with traffic, the admin API (count, list,
// cancel), token enforcement, health and readiness. Logging is in
// service_log_test.go; the binary's signals in cmd/delayproxy.

// TestService_MetricsMoveWithDelayedTraffic: a few delayed publishes and
// their releases move the counters, the per-exchange pending gauge (up, then
// down), the lateness and commit histograms, by the right amounts.
func TestService_MetricsMoveWithDelayedTraffic(t *testing.T) {
	t.Parallel()
	tp, ch := startConfirmed(t)
	ex, q := delayedQueue(t, ch, "direct", "k")
	cons := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)
	pending := []string{"vhost", "/", "exchange", ex}

	before := scrape(t, tp)
	// The Go and process collectors are in the same registry.
	for _, name := range []string{
		"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds", "go_info",
		"process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds",
	} {
		if _, ok := before[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	before.want(t, "delayproxy_messages_stored_total", 0)
	before.want(t, "delayproxy_messages_released_total", 0)
	before.want(t, "delayproxy_pending_messages", 0, pending...) // declared, so present at 0
	before.want(t, "delayproxy_release_lateness_seconds", 0)

	const n = 5
	for i := range n {
		publishConfirmed(t, ch, ex, "k", false, delayedMsg(int32(400+50*i), fmt.Sprint("m", i)))
	}
	mid := scrape(t, tp)
	mid.want(t, "delayproxy_messages_stored_total", n)
	mid.want(t, "delayproxy_pending_messages", n, pending...)
	mid.want(t, "delayproxy_store_written_messages_total", n)
	if c0, c1 := before.get(t, "delayproxy_store_commit_duration_seconds"), mid.get(t, "delayproxy_store_commit_duration_seconds"); c1 <= c0 {
		t.Errorf("store commit histogram count %v -> %v after %d confirmed publishes", c0, c1, n)
	}
	if b := mid.get(t, "delayproxy_store_commit_batch_messages"); b < 1 {
		t.Errorf("store commit batch histogram count = %v", b)
	}
	if _, ok := mid.lookup("delayproxy_next_due_timestamp_seconds"); !ok {
		t.Error("delayproxy_next_due_timestamp_seconds absent with messages pending")
	}

	cons.wait(t, n, 20*time.Second)
	// The store deletes a release once RabbitMQ confirmed it, batched: the
	// gauge falls to 0 shortly after the deliveries.
	var after metricsSnapshot
	testwait.Until(t, 10*time.Second, "pending gauge back to 0", func() bool {
		after = scrape(t, tp)
		v, _ := after.lookup("delayproxy_pending_messages", pending...)
		// A scrape reads one series after another: wait for the counter too.
		d, _ := after.lookup("delayproxy_store_deleted_messages_total")
		return v == 0 && d >= n
	})
	after.want(t, "delayproxy_messages_stored_total", n) // no more
	after.want(t, "delayproxy_messages_released_total", n)
	after.want(t, "delayproxy_release_lateness_seconds", n)
	if sum := after.histSum(t, "delayproxy_release_lateness_seconds"); sum < 0 {
		t.Errorf("release lateness sum %v < 0: released early", sum)
	}
	if d := after.get(t, "delayproxy_store_deleted_messages_total"); d != n {
		t.Errorf("delayproxy_store_deleted_messages_total = %v, want %d", d, n)
	}
	if c1, c2 := mid.get(t, "delayproxy_store_commit_duration_seconds"), after.get(t, "delayproxy_store_commit_duration_seconds"); c2 <= c1 {
		t.Errorf("store commit histogram count %v -> %v after the releases were deleted", c1, c2)
	}
	if _, ok := after.lookup("delayproxy_next_due_timestamp_seconds"); ok {
		t.Error("delayproxy_next_due_timestamp_seconds present with nothing pending")
	}
	for _, name := range []string{"delayproxy_messages_cancelled_total", "delayproxy_messages_discarded_total", "delayproxy_messages_unroutable_total"} {
		after.want(t, name, 0)
	}
	if got := messageIDs(cons.snapshot()); !slices.Equal(got, []string{"m0", "m1", "m2", "m3", "m4"}) {
		t.Errorf("delivered %v", got)
	}
}

// TestService_ConnectionMetrics: the relay's own series move: the client
// connection and channel gauges follow a client, the opened and closed
// counters count it, frames and bytes relayed count both directions.
func TestService_ConnectionMetrics(t *testing.T) {
	t.Parallel()
	tp := startProxy(t, nil)
	s0 := scrape(t, tp)
	s0.want(t, "delayproxy_client_connections", 0)

	conn := tp.dial(t)
	ch := testbroker.Channel(t, conn)
	q := testbroker.DeclareQueue(t, true, nil)
	// A relayed round trip: queue.declare (passive) and its declare-ok.
	if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publish(t, ch, "", q, amqp.Publishing{Body: []byte("relayed")})
	var s1 metricsSnapshot
	testwait.Until(t, 10*time.Second, "connection and channel gauges at 1, the publish relayed", func() bool {
		s1 = scrape(t, tp)
		c, _ := s1.lookup("delayproxy_client_connections")
		n, _ := s1.lookup("delayproxy_channels")
		// The publish is asynchronous: wait until its frames went upstream.
		f, _ := s1.lookup("delayproxy_relayed_frames_total", "direction", "client_to_upstream")
		// A scrape reads one series after another, not at one instant:
		// the counter may be read before and the gauge after a change.
		o, _ := s1.lookup("delayproxy_connections_opened_total")
		return c == 1 && n == 1 && f >= 4 && o == 1
	})
	s1.want(t, "delayproxy_connections_opened_total", 1)
	s1.want(t, "delayproxy_connections_closed_total", 0)
	for _, dir := range []string{"client_to_upstream", "upstream_to_client"} {
		if f := s1.get(t, "delayproxy_relayed_frames_total", "direction", dir); f < 1 {
			t.Errorf("relayed frames %s = %v", dir, f)
		}
		if b := s1.get(t, "delayproxy_relayed_bytes_total", "direction", dir); b < 8 {
			t.Errorf("relayed bytes %s = %v", dir, b)
		}
	}
	// The publish (method, header, body: 3 frames) went upstream.
	if f := s1.get(t, "delayproxy_relayed_frames_total", "direction", "client_to_upstream"); f < 4 {
		t.Errorf("relayed frames client_to_upstream = %v, want >= 4 (declare + publish)", f)
	}

	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "channel gauge back to 0", func() bool {
		v, _ := scrape(t, tp).lookup("delayproxy_channels")
		return v == 0
	})
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	var s2 metricsSnapshot
	testwait.Until(t, 10*time.Second, "connection gauge back to 0, the close counted", func() bool {
		s2 = scrape(t, tp)
		v, _ := s2.lookup("delayproxy_client_connections")
		c, _ := s2.lookup("delayproxy_connections_closed_total")
		return v == 0 && c >= 1
	})
	s2.want(t, "delayproxy_connections_opened_total", 1)
	s2.want(t, "delayproxy_connections_closed_total", 1)
	if n := len(drain(t, q)); n != 1 {
		t.Errorf("queue got %d messages, want the 1 relayed", n)
	}
}

// TestService_AdminCountListCancel: a running proxy's admin API counts and
// lists the pending messages of a delayed exchange (with and without bodies,
// in pages), and cancels by message-id, by key and all of an exchange; a
// cancelled message never arrives while the others do, and the counts and
// the cancelled counter follow.
func TestService_AdminCountListCancel(t *testing.T) {
	t.Parallel()
	tp, ch := startConfirmed(t)
	ex := declareDelayed(t, ch, "direct", nil)
	other := declareDelayed(t, ch, "fanout", nil)
	q, qOther := testbroker.DeclareQueue(t, true, nil), testbroker.DeclareQueue(t, true, nil)
	bind(t, q, "k", ex, nil)
	bind(t, qOther, "", other, nil)
	cons := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)
	consOther := consume(t, testbroker.Dial(t, testbroker.URL(t)), qOther)

	// Long enough for the API calls below to come before any is due on a
	// loaded machine; every call checks that it did.
	const base = 2500 * time.Millisecond
	ids8 := []string{"m0", "dup", "m2", "m3", "dup", "m5", "m6", "m7"}
	start := time.Now()
	for i, id := range ids8 {
		msg := delayedMsg(int32((base+time.Duration(i)*20*time.Millisecond)/time.Millisecond), id)
		msg.Priority = uint8(i % 3)
		msg.Body = []byte(fmt.Sprintf("body %d of %s", i, id))
		publishConfirmed(t, ch, ex, "k", false, msg)
	}
	for i := range 3 {
		publishConfirmed(t, ch, other, "", false, delayedMsg(int32(base/time.Millisecond), fmt.Sprint("o", i)))
	}
	firstDue := start.Add(base)
	inTime := func(what string) {
		t.Helper()
		if now := time.Now(); !now.Before(firstDue) {
			t.Fatalf("%s done %v after the first message was due: machine too slow for this test", what, now.Sub(firstDue))
		}
	}

	// Counts: the exchange, and the list of all exchanges.
	if n := tp.pending(t, ex); n != 8 {
		t.Errorf("pending(%s) = %d, want 8", ex, n)
	}
	var all struct {
		Exchanges []struct {
			VHost, Name, Type string
			Pending           int64
		} `json:"exchanges"`
	}
	getJSON(t, tp, "/api/exchanges", &all)
	found := 0
	for _, e := range all.Exchanges {
		switch {
		case e.VHost == "/" && e.Name == ex:
			found++
			if e.Pending != 8 || e.Type != "direct" {
				t.Errorf("%s in the list: %+v", ex, e)
			}
		case e.VHost == "/" && e.Name == other:
			found++
			if e.Pending != 3 || e.Type != "fanout" {
				t.Errorf("%s in the list: %+v", other, e)
			}
		}
	}
	if found != 2 {
		t.Errorf("GET /api/exchanges lists %d of our 2 exchanges: %+v", found, all.Exchanges)
	}

	// List in pages of 3, without bodies: release (due) order, keys chain.
	listed := testpaging.All(t, 3, 5, func(m admin.Message) string { return m.Key }, func(after string) ([]admin.Message, string) {
		var p admin.MessagePage
		getJSON(t, tp, exchangePath(ex)+"/messages?limit=3&after="+after, &p)
		return p.Messages, p.NextAfter
	})
	if len(listed) != len(ids8) {
		t.Fatalf("listed %d messages, want %d", len(listed), len(ids8))
	}
	keys := map[string]bool{}
	for i, m := range listed {
		if m.MessageID != ids8[i] || m.RoutingKey != "k" || m.Priority != uint8(i%3) {
			t.Errorf("listed[%d] = %+v, want message-id %s, key k, priority %d", i, m, ids8[i], i%3)
		}
		if m.DelayMs != int64((base+time.Duration(i)*20*time.Millisecond)/time.Millisecond) {
			t.Errorf("listed[%d] delay %d ms", i, m.DelayMs)
		}
		if due := time.UnixMilli(m.DueMs); due.Before(start.Add(time.Duration(m.DelayMs)*time.Millisecond)) || due.After(time.Now().Add(time.Duration(m.DelayMs)*time.Millisecond)) {
			t.Errorf("listed[%d] due %v, not publish time + delay", i, due)
		}
		if m.Body != nil || m.Size != nil {
			t.Errorf("listed[%d] has a body or size without body=true", i)
		}
		if keys[m.Key] {
			t.Errorf("key %s listed twice", m.Key)
		}
		keys[m.Key] = true
	}
	// With bodies.
	var withBody admin.MessagePage
	getJSON(t, tp, exchangePath(ex)+"/messages?body=true&limit=100", &withBody)
	if len(withBody.Messages) != len(ids8) || withBody.NextAfter != "" {
		t.Fatalf("body=true lists %d messages (next %q), want %d in one page", len(withBody.Messages), withBody.NextAfter, len(ids8))
	}
	for i, m := range withBody.Messages {
		want := fmt.Sprintf("body %d of %s", i, ids8[i])
		if string(m.Body) != want || m.Size == nil || *m.Size != len(want) || m.Key != listed[i].Key {
			t.Errorf("body=true [%d] = body %q size %v key %s, want %q", i, m.Body, m.Size, m.Key, want)
		}
	}
	inTime("counting and listing")

	// Cancel by message-id: both "dup".
	if n := cancel(t, tp, exchangePath(ex)+"/messages/dup"); n != 2 {
		t.Errorf("cancel dup = %d, want 2", n)
	}
	// By key: m3.
	if n := cancel(t, tp, exchangePath(ex)+"/messages/by-key/"+listed[3].Key); n != 1 {
		t.Errorf("cancel m3 by key = %d, want 1", n)
	}
	// All of the other exchange.
	if n := cancel(t, tp, exchangePath(other)+"/messages"); n != 3 {
		t.Errorf("cancel all of %s = %d, want 3", other, n)
	}
	inTime("cancelling")
	if code, body := tp.httpDo(t, http.MethodDelete, exchangePath(ex)+"/messages/dup"); code != http.StatusNotFound {
		t.Errorf("cancel dup again = %d %s, want 404", code, body)
	}
	if n := tp.pending(t, ex); n != 5 {
		t.Errorf("pending(%s) after cancels = %d, want 5", ex, n)
	}
	if n := tp.pending(t, other); n != 0 {
		t.Errorf("pending(%s) after cancel all = %d, want 0", other, n)
	}
	left := tp.listPending(t, ex)
	var leftIDs []string
	for _, m := range left {
		leftIDs = append(leftIDs, m.MessageID)
	}
	wantLeft := []string{"m0", "m2", "m5", "m6", "m7"}
	if !slices.Equal(leftIDs, wantLeft) {
		t.Errorf("left after cancels: %v, want %v", leftIDs, wantLeft)
	}
	if v := tp.metric(t, "delayproxy_messages_cancelled_total"); v != 6 {
		t.Errorf("delayproxy_messages_cancelled_total = %v, want 6", v)
	}

	// The others arrive. Every cancelled message was due before the last of
	// them, and release goes in due order, so once it is in and the store
	// is empty a cancelled one would have come; wait a margin more anyway.
	cons.wait(t, len(wantLeft), 30*time.Second)
	testwait.Until(t, 10*time.Second, "pending of "+ex+" to reach 0", func() bool { return tp.pending(t, ex) == 0 })
	time.Sleep(500 * time.Millisecond) // a margin past every due time, for a message that must not come
	// Compared as sets: the order has tests of its own, and on a loaded
	// machine messages 20 ms apart can be overdue together, which releases
	// them by priority (m2 and m5 before m0).
	got := messageIDs(cons.stop(t))
	slices.Sort(got)
	if !slices.Equal(got, wantLeft) {
		t.Errorf("delivered %v, want %v (cancelled ones must never arrive)", got, wantLeft)
	}
	if got := consOther.stop(t); len(got) != 0 {
		t.Errorf("cancelled exchange delivered %v", messageIDs(got))
	}
	if v := tp.metric(t, "delayproxy_messages_released_total"); v != float64(len(wantLeft)) {
		t.Errorf("delayproxy_messages_released_total = %v, want %d", v, len(wantLeft))
	}
	if v := tp.metric(t, "delayproxy_messages_cancelled_total"); v != 6 {
		t.Errorf("delayproxy_messages_cancelled_total after the releases = %v, want 6", v)
	}
	if v := tp.metric(t, "delayproxy_messages_discarded_total"); v != 0 {
		t.Errorf("cancelled messages counted as discarded too: %v", v)
	}
}

// cancel sends an admin DELETE and returns the cancelled count.
func cancel(t testing.TB, tp *testProxy, path string) int64 {
	t.Helper()
	code, body := tp.httpDo(t, http.MethodDelete, path)
	if code != http.StatusOK {
		t.Fatalf("DELETE %s: %d %s", path, code, body)
	}
	var r struct {
		Cancelled *int64 `json:"cancelled"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Cancelled == nil {
		t.Fatalf("DELETE %s: %q: %v", path, body, err)
	}
	return *r.Cancelled
}

// nonLoopbackHost is an address of this machine that is not loopback: the
// first global IPv4 address of an interface, or 0.0.0.0 (every interface)
// when there is none.
func nonLoopbackHost(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return "0.0.0.0"
}

const svcToken = "svc-e2e-token-0123456789abcdef"

// TestService_TokenRequiredOffLoopback: New refuses an HTTP address off
// loopback without a token, naming the setting.
func TestService_TokenRequiredOffLoopback(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", net.JoinHostPort(nonLoopbackHost(t), "0")} {
		t.Run(addr, func(t *testing.T) {
			cfg := delayproxy.DefaultConfig()
			cfg.ListenAddr = "127.0.0.1:0"
			cfg.DataDir = t.TempDir()
			cfg.HTTPAddr = addr
			_, err := delayproxy.New(cfg, testlog.New())
			if err == nil || !strings.Contains(err.Error(), "--admin-token (DELAYPROXY_ADMIN_TOKEN)") {
				t.Errorf("New with --http-addr %s and no token: %v, want an error naming --admin-token", addr, err)
			}
			cfg.AdminToken = svcToken[:15]
			if _, err := delayproxy.New(cfg, testlog.New()); err == nil || !strings.Contains(err.Error(), "--admin-token") {
				t.Errorf("New with a 15-character token: %v, want an error naming --admin-token", err)
			}
			cfg.AdminToken = svcToken
			if _, err := delayproxy.New(cfg, testlog.New()); err != nil {
				t.Errorf("New with a token: %v", err)
			}
		})
	}
}

// TestService_TokenEnforced: a proxy serving HTTP on a non-loopback address
// with a token answers /api/ only with that token (and changes nothing
// without it), while /metrics, /healthz and /readyz need none.
func TestService_TokenEnforced(t *testing.T) {
	t.Parallel()
	host := nonLoopbackHost(t)
	tp := startProxy(t, func(c *delayproxy.Config) {
		c.HTTPAddr = net.JoinHostPort(host, "0")
		c.AdminToken = svcToken
	})
	if host != "0.0.0.0" && !strings.Contains(tp.HTTP(), host) {
		t.Fatalf("HTTP server at %s, want %s", tp.HTTP(), host)
	}
	ch := confirmChannel(t, tp.dial(t))
	ex := declareDelayed(t, ch, "direct", nil)
	publishConfirmed(t, ch, ex, "k", false, delayedMsg(int32(time.Hour/time.Millisecond), "held"))

	msgs := exchangePath(ex) + "/messages"
	tests := []struct {
		name, method, path, auth string
		want                     int
	}{
		{"metrics without token", "GET", "/metrics", "", 200},
		{"healthz without token", "GET", "/healthz", "", 200},
		{"readyz without token", "GET", "/readyz", "", 200},
		{"list exchanges without token", "GET", "/api/exchanges", "", 401},
		{"list exchanges, wrong token", "GET", "/api/exchanges", "Bearer " + strings.ToUpper(svcToken), 401},
		{"list messages without token", "GET", msgs, "", 401},
		{"cancel all without token", "DELETE", msgs, "", 401},
		{"cancel all, wrong token", "DELETE", msgs, "Bearer wrong-token-0123456789", 401},
		{"cancel one, token as basic auth", "DELETE", msgs + "/held", "Basic " + svcToken, 401},
		{"list exchanges with the token", "GET", "/api/exchanges", "Bearer " + svcToken, 200},
		{"list messages with the token", "GET", msgs, "Bearer " + svcToken, 200},
	}
	for _, tt := range tests {
		code, body := authDo(t, tp, tt.method, tt.path, tt.auth)
		if code != tt.want {
			t.Errorf("%s: %s %s = %d %s, want %d", tt.name, tt.method, tt.path, code, body, tt.want)
		}
	}
	code, body := authDo(t, tp, "GET", exchangePath(ex), "Bearer "+svcToken)
	var e struct {
		Pending int64 `json:"pending"`
	}
	if err := json.Unmarshal(body, &e); code != 200 || err != nil || e.Pending != 1 {
		t.Errorf("after refused cancels: %d %s (%v), want the message still pending", code, body, err)
	}
	if code, body := authDo(t, tp, "DELETE", msgs+"/held", "Bearer "+svcToken); code != 200 {
		t.Errorf("cancel with the token: %d %s", code, body)
	}
}

// authDo sends a request with an Authorization header (none when auth is
// "") to the proxy's HTTP server.
func authDo(t testing.TB, tp *testProxy, method, path, auth string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, tp.HTTP()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, body
}

// TestService_HealthAndReadiness: /healthz answers 200 while the proxy
// runs; /readyz answers 200 with RabbitMQ up and 503 naming the cause when
// the upstream is unreachable (a closed port), while /healthz stays 200.
func TestService_HealthAndReadiness(t *testing.T) {
	t.Parallel()
	t.Run("upstream up", func(t *testing.T) {
		t.Parallel()
		tp := startProxy(t, nil)
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := tp.httpDo(t, "GET", path); code != 200 || strings.TrimSpace(string(body)) != "ok" {
				t.Errorf("GET %s = %d %q, want 200 ok", path, code, body)
			}
		}
	})
	t.Run("upstream unreachable", func(t *testing.T) {
		t.Parallel()
		addr := crashtest.FreePort(t)
		tp := startProxy(t, func(c *delayproxy.Config) { c.UpstreamURL = "amqp://guest:guest@" + addr + "/" })
		if code, body := tp.httpDo(t, "GET", "/healthz"); code != 200 {
			t.Errorf("GET /healthz = %d %q, want 200 (the process is alive)", code, body)
		}
		code, body := tp.httpDo(t, "GET", "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "upstream unreachable") {
			t.Errorf("GET /readyz = %d %q, want 503 naming the upstream", code, body)
		}
		if strings.Contains(string(body), "guest:guest") {
			t.Errorf("/readyz shows the upstream credentials: %q", body)
		}
		// A client gets nothing either.
		if c, err := amqp.Dial(tp.URL()); err == nil {
			c.Close()
			t.Error("a client connected through a proxy whose upstream is down")
		}
	})
}

// TestService_HeartbeatFlagReachesClients: --heartbeat is what the proxy
// proposes; amqp091-go (10 s by default) takes the smaller of the two.
func TestService_HeartbeatFlagReachesClients(t *testing.T) {
	t.Parallel()
	tests := []struct {
		flag time.Duration
		want time.Duration
	}{
		{7 * time.Second, 7 * time.Second},
		{0, 10 * time.Second}, // none proposed: the client's own
	}
	for _, tt := range tests {
		t.Run(tt.flag.String(), func(t *testing.T) {
			tp := startProxy(t, func(c *delayproxy.Config) { c.Heartbeat = tt.flag })
			if got := tp.dial(t).Config.Heartbeat; got != tt.want {
				t.Fatalf("negotiated heartbeat %v, want %v", got, tt.want)
			}
		})
	}
}
