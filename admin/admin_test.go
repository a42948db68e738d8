package admin

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy/internal/testpaging"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "test-token-0123456789"

// fixture is a server over a real store in a temp dir.
type fixture struct {
	st   *boltstore.Store
	m    *metrics.Metrics
	srv  *Server
	http *httptest.Server
	due  int64 // due time of the first seeded message
}

// newFixture opens a real store, registers two delayed exchanges and seeds
// messages: five in "/"/"orders" (message-ids a, b, b, c, "" with rising due
// times) and one in "prod"/"mail/x".
func newFixture(t *testing.T, token string, ready func(context.Context) error) *fixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "delayproxy.db")
	st := teststore.Open(t, path, boltstore.Options{NoSync: true})
	ctx := context.Background()
	for _, def := range []store.ExchangeDef{
		{VHost: "/", Name: "orders", DelayedType: "direct", Durable: true},
		{VHost: "prod", Name: "mail/x", DelayedType: "topic"},
		{VHost: "/", Name: "empty", DelayedType: "fanout"},
	} {
		if err := st.PutExchange(ctx, &def); err != nil {
			t.Fatalf("PutExchange: %v", err)
		}
	}
	due := time.Now().Add(time.Hour).UnixMilli()
	var msgs []*store.Message
	for i, id := range []string{"a", "b", "b", "c", ""} {
		msgs = append(msgs, &store.Message{
			VHost: "/", Exchange: "orders", RoutingKey: fmt.Sprintf("rk%d", i),
			Body: []byte(fmt.Sprintf("body-%d", i)), Due: due + int64(i)*1000, Delay: 3600_000 + int64(i)*1000,
			Priority: uint8(i), MessageID: id,
		})
	}
	msgs = append(msgs, &store.Message{VHost: "prod", Exchange: "mail/x", Body: []byte("m"), Due: due + 500, Delay: 1})
	storetest.Put(t, st, msgs...)
	m := metrics.New()
	if err := m.RegisterStore(st, path); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Addr: "127.0.0.1:0", Token: token, Engine: st, Metrics: m, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &fixture{st: st, m: m, srv: srv, http: hs, due: due}
}

// do sends a request with the token (if any) and returns status and body.
func (f *fixture) do(t *testing.T, method, path, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.http.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// getJSON does a request that must answer want and decodes the JSON body.
func (f *fixture) getJSON(t *testing.T, method, path string, want int, v any) {
	t.Helper()
	code, body := f.do(t, method, path, "")
	if code != want {
		t.Fatalf("%s %s = %d %s, want %d", method, path, code, body, want)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("%s %s: bad JSON %q: %v", method, path, body, err)
	}
}

func TestListExchanges(t *testing.T) {
	f := newFixture(t, "", nil)
	var resp ExchangeList
	f.getJSON(t, "GET", "/api/exchanges", 200, &resp)
	if resp.Pending != 6 {
		t.Errorf("pending = %d, want 6", resp.Pending)
	}
	got := map[string]Exchange{}
	for _, e := range resp.Exchanges {
		got[e.VHost+"|"+e.Name] = e
	}
	if len(got) != 3 {
		t.Fatalf("exchanges = %+v, want 3", resp.Exchanges)
	}
	orders := got["/|orders"]
	if orders.Pending != 5 || orders.DelayedType != "direct" || !orders.Durable || !orders.Registered {
		t.Errorf("orders = %+v", orders)
	}
	if orders.NextDueMs != f.due || orders.NextDue != time.UnixMilli(f.due).UTC().Format(rfc3339Milli) {
		t.Errorf("orders next due = %d %q, want %d", orders.NextDueMs, orders.NextDue, f.due)
	}
	if e := got["/|empty"]; e.Pending != 0 || e.NextDue != "" {
		t.Errorf("empty = %+v", e)
	}
	if e := got["prod|mail/x"]; e.Pending != 1 {
		t.Errorf("mail/x = %+v", e)
	}

	var one Exchange
	f.getJSON(t, "GET", "/api/exchanges/%2F/orders", 200, &one)
	if one.Pending != 5 || one.Name != "orders" || one.VHost != "/" {
		t.Errorf("GET one = %+v", one)
	}
	f.getJSON(t, "GET", "/api/exchanges/prod/mail%2Fx", 200, &one)
	if one.Pending != 1 || one.Name != "mail/x" {
		t.Errorf("GET escaped name = %+v", one)
	}
}

func TestListMessagesPages(t *testing.T) {
	f := newFixture(t, "", nil)
	all := testpaging.All(t, 2, 6, func(m Message) string { return m.Key }, func(after string) ([]Message, string) {
		var r MessagePage
		f.getJSON(t, "GET", "/api/exchanges/%2F/orders/messages?limit=2&after="+after, 200, &r)
		return r.Messages, r.NextAfter
	})
	if len(all) != 5 {
		t.Fatalf("listed %d messages, want 5: %+v", len(all), all)
	}
	for i, m := range all {
		if m.RoutingKey != fmt.Sprintf("rk%d", i) || m.DueMs != f.due+int64(i)*1000 || m.Priority != uint8(i) {
			t.Errorf("message %d = %+v (not in release order?)", i, m)
		}
		if m.Body != nil {
			t.Errorf("message %d has a body without body=true", i)
		}
		if m.Size != nil {
			t.Errorf("message %d has a size without body=true", i)
		}
		if m.DelayMs != 3600_000+int64(i)*1000 {
			t.Errorf("message %d delay = %d", i, m.DelayMs)
		}
		if _, err := time.Parse(time.RFC3339, m.Due); err != nil {
			t.Errorf("message %d due %q: %v", i, m.Due, err)
		}
	}
	if all[0].MessageID != "a" || all[4].MessageID != "" {
		t.Errorf("message ids: %q %q", all[0].MessageID, all[4].MessageID)
	}

	var r MessagePage
	f.getJSON(t, "GET", "/api/exchanges/%2F/orders/messages?body=true&limit=1", 200, &r)
	if len(r.Messages) != 1 || string(r.Messages[0].Body) != "body-0" || r.Messages[0].Size == nil || *r.Messages[0].Size != 6 {
		t.Errorf("with body: %+v", r.Messages)
	}
	code, raw := f.do(t, "GET", "/api/exchanges/%2F/orders/messages?body=true&limit=1", "")
	if code != 200 || !strings.Contains(string(raw), `"body": "Ym9keS0w"`) { // base64("body-0")
		t.Errorf("body is not base64 in %s", raw)
	}
	var empty MessagePage
	f.getJSON(t, "GET", "/api/exchanges/%2F/empty/messages", 200, &empty)
	if len(empty.Messages) != 0 || empty.NextAfter != "" {
		t.Errorf("empty exchange lists %+v", empty)
	}
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t, "", nil)
	tests := []struct {
		method, path string
		want         int
	}{
		{"GET", "/api/exchanges/%2F/orders/messages?limit=0", 400},
		{"GET", "/api/exchanges/%2F/orders/messages?limit=1001", 400},
		{"GET", "/api/exchanges/%2F/orders/messages?limit=101&body=true", 400},
		{"GET", "/api/exchanges/%2F/orders/messages?limit=ten", 400},
		{"GET", "/api/exchanges/%2F/orders/messages?after=zz", 400},
		{"GET", "/api/exchanges/%2F/orders/messages?after=" + strings.Repeat("g", 34), 400},
		{"GET", "/api/exchanges/%2F/orders/messages?body=maybe", 400},
		{"DELETE", "/api/exchanges/%2F/orders/messages/by-key/1234", 400},
		{"GET", "/api/exchanges/%2F/nope", 404},
		{"GET", "/api/exchanges/%2F/nope/messages", 404},
		{"GET", "/api/exchanges/nope/orders/messages", 404},
		{"DELETE", "/api/exchanges/%2F/nope/messages", 404},
		{"DELETE", "/api/exchanges/%2F/nope/messages/a", 404},
		{"DELETE", "/api/exchanges/%2F/orders/messages/no-such-id", 404},
		{"DELETE", "/api/exchanges/%2F/orders/messages/by-key/" + strings.Repeat("00", 17), 404},
		{"GET", "/api/nothing/here", 404},
		{"GET", "/api/", 404},
		{"POST", "/api/exchanges", 405},
		{"PUT", "/api/exchanges/%2F/orders/messages", 405},
		{"GET", "/api/exchanges/%2F/orders/messages/a", 405},
		{"POST", "/api/exchanges/%2F/orders/messages/by-key/" + strings.Repeat("00", 17), 405},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			code, body := f.do(t, tt.method, tt.path, "")
			if code != tt.want {
				t.Errorf("status %d %s, want %d", code, body, tt.want)
			}
			var e struct{ Error string }
			if err := json.Unmarshal(body, &e); err != nil || e.Error == "" {
				t.Errorf("not a JSON error: %q", body)
			}
		})
	}
	// 405 names what is allowed.
	req, _ := http.NewRequest("PUT", f.http.URL+"/api/exchanges/%2F/orders/messages", nil)
	resp, err := f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if allow := resp.Header.Get("Allow"); !strings.Contains(allow, "DELETE") || !strings.Contains(allow, "GET") {
		t.Errorf("Allow = %q", allow)
	}
	if f.st.Pending() != 6 {
		t.Errorf("bad requests changed the store: pending = %d", f.st.Pending())
	}
}

func TestCancel(t *testing.T) {
	f := newFixture(t, "", nil)
	var r struct{ Cancelled int64 }

	// By message-id: both "b" go, the second attempt finds none.
	f.getJSON(t, "DELETE", "/api/exchanges/%2F/orders/messages/b", 200, &r)
	if r.Cancelled != 2 {
		t.Errorf("cancel b = %d, want 2", r.Cancelled)
	}
	if code, body := f.do(t, "DELETE", "/api/exchanges/%2F/orders/messages/b", ""); code != 404 {
		t.Errorf("cancel b again = %d %s, want 404", code, body)
	}
	if n := f.st.Count("/", "orders"); n != 3 {
		t.Errorf("orders count = %d, want 3", n)
	}

	// By key: a key of orders is not cancelled through mail/x's URL.
	var l MessagePage
	f.getJSON(t, "GET", "/api/exchanges/%2F/orders/messages", 200, &l)
	if len(l.Messages) != 3 {
		t.Fatalf("after cancel b: %+v", l.Messages)
	}
	key := l.Messages[1].Key // message-id c
	if code, body := f.do(t, "DELETE", "/api/exchanges/prod/mail%2Fx/messages/by-key/"+key, ""); code != 404 {
		t.Errorf("cancel orders' key through mail/x = %d %s, want 404", code, body)
	}
	f.getJSON(t, "DELETE", "/api/exchanges/%2F/orders/messages/by-key/"+key, 200, &r)
	if r.Cancelled != 1 {
		t.Errorf("cancel by key = %d", r.Cancelled)
	}
	if code, _ := f.do(t, "DELETE", "/api/exchanges/%2F/orders/messages/by-key/"+key, ""); code != 404 {
		t.Errorf("cancel the same key again = %d, want 404", code)
	}
	l = MessagePage{} // decoding into old elements would keep absent fields
	f.getJSON(t, "GET", "/api/exchanges/%2F/orders/messages", 200, &l)
	if len(l.Messages) != 2 || l.Messages[0].MessageID != "a" || l.Messages[1].MessageID != "" {
		t.Errorf("left: %+v", l.Messages)
	}

	// The whole exchange; the other exchange keeps its message.
	f.getJSON(t, "DELETE", "/api/exchanges/%2F/orders/messages", 200, &r)
	if r.Cancelled != 2 {
		t.Errorf("cancel all = %d, want 2", r.Cancelled)
	}
	if f.st.Count("/", "orders") != 0 || f.st.Count("prod", "mail/x") != 1 {
		t.Errorf("counts after cancel all: orders %d, mail/x %d", f.st.Count("/", "orders"), f.st.Count("prod", "mail/x"))
	}
	if got := counterValue(t, f.m, "delayproxy_messages_cancelled_total"); got != 5 {
		t.Errorf("delayproxy_messages_cancelled_total = %v, want 5", got)
	}
}

// counterValue reads one unlabelled counter through the registry.
func counterValue(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}

func TestAuth(t *testing.T) {
	f := newFixture(t, testToken, nil)
	open := newFixture(t, "", nil)
	tests := []struct {
		name   string
		f      *fixture
		method string
		path   string
		header string
		want   int
	}{
		{"metrics needs no token", f, "GET", "/metrics", "", 200},
		{"healthz needs no token", f, "GET", "/healthz", "", 200},
		{"readyz needs no token", f, "GET", "/readyz", "", 200},
		{"api without token", f, "GET", "/api/exchanges", "", 401},
		{"api wrong token", f, "GET", "/api/exchanges", "Bearer wrong-token-0123456789", 401},
		{"api token prefix", f, "GET", "/api/exchanges", "Bearer " + testToken[:10], 401},
		{"api token plus suffix", f, "GET", "/api/exchanges", "Bearer " + testToken + "x", 401},
		{"api basic auth", f, "GET", "/api/exchanges", "Basic " + testToken, 401},
		{"api bare token", f, "GET", "/api/exchanges", testToken, 401},
		{"api empty bearer", f, "GET", "/api/exchanges", "Bearer ", 401},
		{"api right token", f, "GET", "/api/exchanges", "Bearer " + testToken, 200},
		{"scheme is case-insensitive", f, "GET", "/api/exchanges", "bearer " + testToken, 200},
		{"unknown path hidden behind 401", f, "GET", "/api/secret", "", 401},
		{"delete without token", f, "DELETE", "/api/exchanges/%2F/orders/messages", "", 401},
		{"wrong method behind 401", f, "POST", "/api/exchanges", "", 401},
		{"no token configured", open, "GET", "/api/exchanges", "", 200},
		{"no token configured, any header", open, "GET", "/api/exchanges", "Bearer whatever", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, tt.f.http.URL+tt.path, nil)
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			resp, err := tt.f.http.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("status %d %s, want %d", resp.StatusCode, body, tt.want)
			}
			if tt.want == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	if f.st.Pending() != 6 {
		t.Errorf("an unauthorised DELETE changed the store: pending = %d", f.st.Pending())
	}
}

func TestReadyz(t *testing.T) {
	var ready error
	f := newFixture(t, "", func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("no deadline")
		}
		return ready
	})
	if code, body := f.do(t, "GET", "/readyz", ""); code != 200 {
		t.Errorf("ready: %d %s", code, body)
	}
	ready = errors.New("upstream unreachable")
	if code, body := f.do(t, "GET", "/readyz", ""); code != 503 || !strings.Contains(string(body), "upstream unreachable") {
		t.Errorf("not ready: %d %s", code, body)
	}
	if code, _ := f.do(t, "GET", "/healthz", ""); code != 200 {
		t.Errorf("healthz follows readiness: %d", code)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	f := newFixture(t, testToken, nil)
	f.m.Stored(1)
	code, body := f.do(t, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`delayproxy_pending_messages{exchange="orders",vhost="/"} 5`,
		`delayproxy_pending_messages{exchange="mail/x",vhost="prod"} 1`,
		"delayproxy_messages_stored_total 1",
		"delayproxy_release_lateness_seconds_bucket",
		"delayproxy_relayed_frames_total",
		"delayproxy_store_file_bytes",
		"go_goroutines",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestNewRefusesPublicAddressWithoutToken(t *testing.T) {
	st := teststore.Open(t, "", boltstore.Options{NoSync: true})
	m := metrics.New()
	for _, tt := range []struct {
		addr, token string
		ok          bool
	}{
		{"0.0.0.0:15673", "", false},
		{":15673", "", false},
		{"[::]:15673", "", false},
		{"10.1.2.3:15673", "", false},
		{"0.0.0.0:15673", testToken, true},
		{"127.0.0.1:15673", "", true},
		{"[::1]:15673", "", true},
		{"localhost:15673", "", true},
	} {
		_, err := New(Options{Addr: tt.addr, Token: tt.token, Engine: st, Metrics: m})
		if tt.ok != (err == nil) {
			t.Errorf("New(%q, token %v) = %v", tt.addr, tt.token != "", err)
		}
		if !tt.ok && !errors.Is(err, ErrNoToken) {
			t.Errorf("New(%q) = %v, want ErrNoToken", tt.addr, err)
		}
	}
	if _, err := New(Options{Addr: "127.0.0.1:0", Metrics: m}); err == nil {
		t.Error("New without an Engine succeeded")
	}
}

func TestStartProbeShutdown(t *testing.T) {
	st := teststore.Open(t, "", boltstore.Options{NoSync: true})
	srv, err := New(Options{Addr: "127.0.0.1:0", Engine: st, Metrics: metrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start = %v, want ErrStarted", err)
	}
	_, port, _ := net.SplitHostPort(srv.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, addr := range []string{srv.Addr().String(), "0.0.0.0:" + port, ":" + port} {
		if err := Probe(ctx, addr, "/healthz"); err != nil {
			t.Errorf("Probe(%s) = %v", addr, err)
		}
	}
	if err := Probe(ctx, srv.Addr().String(), "/nope"); err == nil {
		t.Error("Probe of a 404 succeeded")
	}
	// A second server on the same address fails at Start, not later.
	other, _ := New(Options{Addr: srv.Addr().String(), Engine: st, Metrics: metrics.New()})
	if err := other.Start(); err == nil {
		t.Error("Start on a used address succeeded")
		_ = other.Shutdown(ctx)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown = %v", err)
	}
	if err := Probe(ctx, srv.Addr().String(), "/healthz"); err == nil {
		t.Error("Probe after Shutdown succeeded")
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "127.9.9.9:1": true, "[::1]:1": true, "localhost:1": true, "LocalHost:1": true,
		":1": false, "0.0.0.0:1": false, "[::]:1": false, "192.168.1.1:1": false, "example.com:1": false,
		"localhost": false, "": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestParseKey(t *testing.T) {
	k := store.MakeKey(1234567890123, 7, 42)
	got, err := parseKey(hex.EncodeToString(k[:]))
	if err != nil || got != k {
		t.Errorf("parseKey round trip = %x, %v", got, err)
	}
}

func TestPathEscaping(t *testing.T) {
	f := newFixture(t, "", nil)
	ctx := context.Background()
	def := store.ExchangeDef{VHost: "a/b", Name: "50%+1 é/..", DelayedType: "direct"}
	if err := f.st.PutExchange(ctx, &def); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Put(ctx, &store.Message{VHost: def.VHost, Exchange: def.Name, Body: []byte("x"), Due: f.due, Delay: 1, MessageID: "id/with%slash", Incarnation: def.Incarnation}); err != nil {
		t.Fatal(err)
	}
	base := "/api/exchanges/" + url.PathEscape(def.VHost) + "/" + url.PathEscape(def.Name)
	var e Exchange
	f.getJSON(t, "GET", base, 200, &e)
	if e.VHost != def.VHost || e.Name != def.Name || e.Pending != 1 {
		t.Errorf("GET %s = %+v", base, e)
	}
	// %2F must not be confused with a literal "%2F" in a name.
	if code, body := f.do(t, "GET", "/api/exchanges/a%252Fb/"+url.PathEscape(def.Name), ""); code != 404 {
		t.Errorf("vhost %q found: %d %s", "a%2Fb", code, body)
	}
	var r struct{ Cancelled int }
	f.getJSON(t, "DELETE", base+"/messages/"+url.PathEscape("id/with%slash"), 200, &r)
	if r.Cancelled != 1 || f.st.Count(def.VHost, def.Name) != 0 {
		t.Errorf("cancel by escaped id: %+v, count %d", r, f.st.Count(def.VHost, def.Name))
	}
}
