package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/admin"
)

// The status page is tested in Debian's chromium, headless, driven over the
// DevTools protocol (chromedp), against a real proxy holding known
// messages: what the page shows must be what the API says.

// browserFlags are the flags that work in a closed network: no sandbox
// (root in CI), no GPU, and nothing that phones home.
var browserFlags = []chromedp.ExecAllocatorOption{
	chromedp.Headless,
	chromedp.NoSandbox,
	chromedp.DisableGPU,
	chromedp.NoFirstRun,
	chromedp.NoDefaultBrowserCheck,
	chromedp.Flag("disable-background-networking", true),
	chromedp.Flag("disable-component-update", true),
	chromedp.Flag("disable-sync", true),
	chromedp.Flag("disable-dev-shm-usage", true),
	chromedp.Flag("disable-extensions", true),
	chromedp.Flag("disable-default-apps", true),
	chromedp.Flag("metrics-recording-only", true),
	chromedp.Flag("password-store", "basic"),
	chromedp.Flag("force-color-profile", "srgb"),
}

// newBrowser starts chromium with a new empty profile; it is stopped when
// the test ends.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("DELAYPROXY_CHROMIUM")
	if path == "" {
		var err error
		if path, err = exec.LookPath("chromium"); err != nil {
			t.Fatalf("chromium not found (install it with `bash .ci/chromium`, or set DELAYPROXY_CHROMIUM): %v", err)
		}
	}
	opts := append([]chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir())}, browserFlags...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	if err := chromedp.Do(bctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// tab is one browser tab and what its console received.
type tab struct {
	ctx  context.Context
	mu   sync.Mutex // guards msgs
	msgs []chromedp.ConsoleMessage
}

// newTab opens a tab of browser, 1280 pixels wide, collecting its console
// messages; it is closed when the test ends.
func newTab(t *testing.T, browser context.Context) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	tb := &tab{ctx: ctx}
	console := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range console {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.msgs = append(tb.msgs, m)
			tb.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	return tb
}

// problems are the console messages that are errors, warnings or
// exceptions, except those allowed matches.
func (tb *tab) problems(allowed *regexp.Regexp) []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []string
	for _, m := range tb.msgs {
		switch m.Type {
		case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
			if allowed == nil || !allowed.MatchString(m.Text) {
				out = append(out, m.String()+" ("+m.URL+")")
			}
		}
	}
	return out
}

// open loads url and waits until the page has rendered the API's data.
func (tb *tab) open(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`main[aria-busy="false"]`))); err != nil {
		t.Fatalf("open %s: %v (console: %v)", url, err, tb.problems(nil))
	}
}

// shownPage is what the page shows, read from its DOM.
type shownPage struct {
	Pending, Overdue, OldestOverdue       string
	StoredRate, ReleasedRate, RefusedRate string
	P50, P99                              string
	StoredTotal, ReleasedTotal            string
	Clients, Channels, Reconnects         string
	UntilMs                               string
	Upcoming                              map[string]string
	Exchanges                             []struct{ VHost, Name, Type, Pending, NextDue string }
	Version, Ready, VHosts, Hash, Token   string
}

const readPageJS = `(() => {
  const t = (id) => document.getElementById(id).textContent;
  const col = (tr, c) => tr.querySelector('[data-col="' + c + '"]');
  return JSON.stringify({
    Pending: t("pending"), Overdue: t("overdue"), OldestOverdue: t("oldest-overdue"),
    StoredRate: t("stored-rate"), ReleasedRate: t("released-rate"), RefusedRate: t("refused-rate"),
    P50: t("lateness-p50"), P99: t("lateness-p99"),
    StoredTotal: t("stored-total"), ReleasedTotal: t("released-total"),
    Clients: t("clients"), Channels: t("channels"), Reconnects: t("reconnects"),
    UntilMs: document.getElementById("rates").dataset.untilMs || "",
    Upcoming: Object.fromEntries([...document.querySelectorAll("#upcoming li")].map(
      (li) => [li.dataset.range, li.querySelector(".count").textContent])),
    Exchanges: [...document.querySelectorAll("#exchanges tbody tr")].map((tr) => ({
      VHost: col(tr, "vhost").textContent, Name: col(tr, "name").firstChild.textContent,
      Type: col(tr, "type").textContent, Pending: col(tr, "pending").textContent,
      NextDue: (col(tr, "next_due").querySelector("time") || {getAttribute: () => ""}).getAttribute("datetime"),
    })),
    Version: t("version"), Ready: t("ready"), VHosts: t("vhosts"),
    Hash: location.hash, Token: sessionStorage.getItem("delayproxy.admin-token") || "",
  });
})()`

func (tb *tab) read(t *testing.T) shownPage {
	t.Helper()
	js, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](readPageJS))
	if err != nil {
		t.Fatalf("read the page: %v", err)
	}
	var p shownPage
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatalf("read the page: %v: %s", err, js)
	}
	return p
}

// apiGet GETs path from p's admin API into a new T, one of admin's answer
// types.
func apiGet[T any](t *testing.T, p *cliProxy, path string) T {
	t.Helper()
	var v T
	b, err := json.Marshal(p.api(t, path))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// shownCount parses a count as the page shows it ("1,234").
func shownCount(t *testing.T, what, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not a count", what, s)
	}
	return n
}

// wantShownNumber checks that s, a rate or a duration as the page shows it
// ("0.25", "12", "1.5 ms", "3.2 s"), is v rounded to the digits shown.
func wantShownNumber(t *testing.T, what, s string, v float64) {
	t.Helper()
	num, unit, _ := strings.Cut(strings.ReplaceAll(s, ",", ""), " ")
	x, err := strconv.ParseFloat(num, 64)
	if err != nil {
		t.Errorf("%s: %q is not a number", what, s)
		return
	}
	scale := map[string]float64{"": 1, "ms": 1e-3, "s": 1}[unit]
	if scale == 0 {
		t.Errorf("%s: %q: unknown unit", what, s)
		return
	}
	digits := 0
	if _, frac, ok := strings.Cut(num, "."); ok {
		digits = len(frac)
	}
	if tol := 0.5 * math.Pow(10, -float64(digits)) * scale; math.Abs(x*scale-v) > tol+1e-12 {
		t.Errorf("%s: the page shows %q, the API says %v", what, s, v)
	}
}

func TestStatusPageInABrowser(t *testing.T) {
	p := startCLIProxy(t)
	// Known messages: far enough ahead that they stay in their range of
	// /api/upcoming for the whole test, whatever the minute.
	orders := p.declareAndPublish(t,
		delayedMsg{id: "o1", delay: 10 * time.Minute},
		delayedMsg{id: "o2", delay: 20 * time.Minute},
		delayedMsg{id: "o3", delay: 2 * time.Hour})
	mail := p.declareAndPublish(t,
		delayedMsg{id: "m1", delay: 72 * time.Hour},
		delayedMsg{id: "m2", delay: 30 * 24 * time.Hour})
	// Traffic released within a second, to a third exchange, and another
	// client that stays connected.
	ticks := p.declareAndPublish(t)
	traffic := startTraffic(t, p, ticks)
	conn, err := amqp.Dial(p.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Channel(); err != nil {
		t.Fatal(err)
	}

	browser := newBrowser(t)
	tb := newTab(t, browser)
	tb.open(t, "http://"+p.httpAddr+"/#token="+cliToken)

	// Rates need two samples of the proxy's history (5 s apart); then the
	// traffic stops and its messages are released.
	waitFor(t, 30*time.Second, "rates on the page", func() bool { return tb.read(t).UntilMs != "" })
	if d, err := time.ParseDuration(os.Getenv("DELAYPROXY_STATUS_TRAFFIC")); err == nil {
		time.Sleep(d) // more history, for the README's screenshot
	}
	traffic.stop()
	var ex admin.ExchangeList
	waitFor(t, 30*time.Second, "the traffic released", func() bool {
		ex = apiGet[admin.ExchangeList](t, p, "/api/exchanges")
		return ex.Pending == 5
	})

	// The page shows what the API says once it has refreshed after that,
	// from the same sample of the history.
	var shown shownPage
	var st admin.Status
	var up admin.Upcoming
	waitFor(t, 30*time.Second, "the page and the API at the same sample", func() bool {
		shown = tb.read(t)
		st = apiGet[admin.Status](t, p, "/api/status")
		ex = apiGet[admin.ExchangeList](t, p, "/api/exchanges")
		up = apiGet[admin.Upcoming](t, p, "/api/upcoming")
		// The backlog is measured about once a second: the last of the
		// traffic may still count as overdue (in flight) for a moment.
		return shown.Pending == "5" && shown.Overdue == "0" && st.Releaser.Overdue == 0 &&
			st.Window != nil && shown.UntilMs == strconv.FormatInt(st.Window.UntilMs, 10)
	})

	// The fragment's token went to sessionStorage and left the address bar.
	if shown.Hash != "" || shown.Token != cliToken {
		t.Errorf("location.hash %q, sessionStorage token %q; want the token moved from the one to the other", shown.Hash, shown.Token)
	}
	if got := shownCount(t, "pending", shown.Pending); got != ex.Pending {
		t.Errorf("pending: the page shows %d, the API says %d", got, ex.Pending)
	}
	if len(shown.Exchanges) != len(ex.Exchanges) || len(ex.Exchanges) != 3 {
		t.Fatalf("the page lists %d exchanges, the API %d, want 3: %+v", len(shown.Exchanges), len(ex.Exchanges), shown.Exchanges)
	}
	wantPending := map[string]int64{orders: 3, mail: 2, ticks: 0}
	for i, e := range ex.Exchanges {
		s := shown.Exchanges[i]
		if s.VHost != e.VHost || s.Name != e.Name || s.Type != e.DelayedType || shownCount(t, "pending of "+e.Name, s.Pending) != e.Pending || s.NextDue != e.NextDue {
			t.Errorf("exchange %d: the page shows %+v, the API says %+v", i, s, e)
		}
		if e.Pending != wantPending[e.Name] {
			t.Errorf("%s holds %d pending, want %d", e.Name, e.Pending, wantPending[e.Name])
		}
	}
	wantUpcoming := map[string]int64{"overdue": 0, "next_minute": 0, "next_hour": 2, "next_day": 1, "next_week": 1, "later": 1}
	for _, r := range up.Ranges {
		if got := shownCount(t, r.Name, shown.Upcoming[r.Name]); got != r.Count {
			t.Errorf("upcoming %s: the page shows %d, the API says %d", r.Name, got, r.Count)
		}
		if r.Count != wantUpcoming[r.Name] {
			t.Errorf("upcoming %s = %d, want the %d known messages", r.Name, r.Count, wantUpcoming[r.Name])
		}
	}
	if len(up.Ranges) != 6 || len(shown.Upcoming) != 6 {
		t.Errorf("upcoming: %d ranges in the API, %d on the page; want 6", len(up.Ranges), len(shown.Upcoming))
	}

	wantShownNumber(t, "stored/s", shown.StoredRate, st.Window.StoredPerSecond)
	wantShownNumber(t, "released/s", shown.ReleasedRate, st.Window.ReleasedPerSecond)
	wantShownNumber(t, "refused/s", shown.RefusedRate, st.Window.RefusedPerSecond)
	if st.Window.StoredPerSecond == 0 || st.Window.ReleasedPerSecond == 0 || st.Window.RefusedPerSecond == 0 {
		t.Errorf("the traffic did not show in the window: %+v", st.Window)
	}
	if st.Window.LatenessP50 == nil || st.Window.LatenessP99 == nil {
		t.Errorf("no lateness in the window %+v, though messages were released", st.Window)
	} else {
		wantShownNumber(t, "lateness p50", shown.P50, *st.Window.LatenessP50)
		wantShownNumber(t, "lateness p99", shown.P99, *st.Window.LatenessP99)
	}
	if got := shownCount(t, "stored total", strings.Fields(shown.StoredTotal)[0]); got != st.Totals.Stored {
		t.Errorf("stored: the page shows %d, the API says %d", got, st.Totals.Stored)
	}
	if got := shownCount(t, "released total", strings.Fields(shown.ReleasedTotal)[0]); got != st.Totals.Released {
		t.Errorf("released: the page shows %d, the API says %d", got, st.Totals.Released)
	}
	// Connected: the traffic's connection and this test's, a channel each.
	if got := shownCount(t, "clients", shown.Clients); got != st.Connections.Clients || got != 2 {
		t.Errorf("clients: the page shows %d, the API says %d; want 2", got, st.Connections.Clients)
	}
	if got := shownCount(t, "channels", shown.Channels); got != st.Connections.Channels || got != 2 {
		t.Errorf("channels: the page shows %d, the API says %d; want 2", got, st.Connections.Channels)
	}
	if got := shownCount(t, "overdue", shown.Overdue); got != st.Releaser.Overdue || got != 0 {
		t.Errorf("overdue: the page shows %d, the API says %d; want 0", got, st.Releaser.Overdue)
	}
	if got := shownCount(t, "reconnects", shown.Reconnects); got != st.Releaser.Reconnects {
		t.Errorf("reconnects: the page shows %d, the API says %d", got, st.Releaser.Reconnects)
	}
	if shown.Version != strings.TrimPrefix(st.Version, "delayproxy ") || st.Version == "" {
		t.Errorf("version: the page shows %q, the API says %q", shown.Version, st.Version)
	}
	if shown.Ready != "reachable" || shown.VHosts != "/" {
		t.Errorf("releaser: RabbitMQ %q, vhosts %q; want reachable, /", shown.Ready, shown.VHosts)
	}

	if problems := tb.problems(nil); len(problems) > 0 {
		t.Errorf("console errors: %q", problems)
	}
	screenshot(t, tb, "status-page.png")
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %v", what, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestStatusPageAsksForTheToken(t *testing.T) {
	p := startCLIProxy(t)
	p.declareAndPublish(t, delayedMsg{id: "x", delay: time.Hour})
	browser := newBrowser(t)
	tb := newTab(t, browser)
	ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate("http://"+p.httpAddr+"/"),
		chromedp.WaitVisible(chromedp.ID("token-form")),
	); err != nil {
		t.Fatalf("no token form: %v (console: %v)", err, tb.problems(nil))
	}
	// A wrong token is refused and the form stays.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("token"), "wrong-token-0123456789"),
		chromedp.Click(chromedp.CSS(`#token-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`#login-error:not(:empty)`)),
	); err != nil {
		t.Fatalf("a wrong token: %v", err)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("token"), cliToken),
		chromedp.Click(chromedp.CSS(`#token-form button`)),
		chromedp.WaitVisible(chromedp.CSS(`main[aria-busy="false"]`)),
	); err != nil {
		t.Fatalf("the right token: %v", err)
	}
	if shown := tb.read(t); shown.Pending != "1" || shown.Token != cliToken {
		t.Errorf("after the token: pending %q, sessionStorage %q", shown.Pending, shown.Token)
	}
	// Forgetting it asks again.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.ID("forget")),
		chromedp.WaitVisible(chromedp.ID("token-form")),
	); err != nil {
		t.Fatalf("forget the token: %v", err)
	}
	// The 401s the browser logs for the requests without the right token
	// are the only messages.
	if problems := tb.problems(regexp.MustCompile(`status of 401 \(Unauthorized\)`)); len(problems) > 0 {
		t.Errorf("console errors: %q", problems)
	}
}

// traffic publishes delayed messages with delays under a second to an
// exchange, bound to a queue, at a rate that rises and falls, and now and
// then one with a bad x-delay that the proxy refuses, until stopped: the
// page then has rates and lateness to show.
type traffic struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startTraffic(t *testing.T, p *cliProxy, exchange string) *traffic {
	t.Helper()
	conn, err := amqp.Dial(p.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// A queue takes them (the last 100), so that they are not unroutable.
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{"x-max-length": int64(100)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "tick", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			// 1 to 4 a tick, over a cycle of 10 s.
			n := 1 + int(2.5+2.5*math.Sin(float64(i)*2*math.Pi/500))
			for j := range n {
				dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "tick", false, false, amqp.Publishing{
					Headers: amqp.Table{"x-delay": int64(100 + (i+j)%18*50)}, Body: []byte("tick"),
				})
				if err == nil {
					_, _ = dc.WaitContext(ctx)
				}
			}
			if i%150 == 10 {
				if bad, err := conn.Channel(); err == nil {
					closed := bad.NotifyClose(make(chan *amqp.Error, 1))
					_ = bad.PublishWithContext(ctx, exchange, "tick", false, false, amqp.Publishing{Headers: amqp.Table{"x-delay": "soon"}})
					select {
					case <-closed:
					case <-ctx.Done():
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	// The connection, and with it the queue, stays until the test ends,
	// so that the messages still delayed when the traffic stops are
	// delivered.
	t.Cleanup(func() {
		tr.stop()
		conn.Close()
	})
	return tr
}

func (tr *traffic) stop() {
	tr.cancel()
	<-tr.done
}

// screenshot writes a PNG of the whole page to $DELAYPROXY_ARTIFACTS (or
// the test's temporary directory) and logs where.
func screenshot(t *testing.T, tb *tab, name string) {
	t.Helper()
	png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("DELAYPROXY_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
