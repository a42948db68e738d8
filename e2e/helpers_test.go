package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/testpaging"
	"github.com/delayproxy/delayproxy/internal/testproxy"
	"github.com/delayproxy/delayproxy/scheduler"
	"github.com/delayproxy/delayproxy/store/boltstore"
)

// amqp091-go ends every goroutine it starts once a connection is closed, so
// no ignore options are needed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testProxy is a whole delayproxy (listener, store, scheduler, releaser,
// admin) in front of the test broker, on a data dir kept across restart.
type testProxy struct {
	t    testing.TB
	cfg  delayproxy.Config
	log  *slog.Logger        // the proxy's logger
	opts []delayproxy.Option // delayproxy.New's options

	mu      sync.Mutex         // guards the fields below, which restart replaces
	run     *testproxy.Running // nil when stopped
	amqpURL string             // amqp://user:pass@127.0.0.1:port/ with the broker's credentials
	httpURL string             // http://127.0.0.1:port
}

// startProxy runs a Proxy in front of testbroker.URL on a t.TempDir() data
// dir with both listeners on loopback ports; opt may change the Config. The
// proxy is stopped in t.Cleanup (Run must return nil) and its store is then
// checked for integrity.
func startProxy(t testing.TB, opt func(*delayproxy.Config)) *testProxy {
	t.Helper()
	return startProxyWith(t, opt, testlog.For(t))
}

// startProxyOn is startProxy in front of broker b.
func startProxyOn(t testing.TB, b testbroker.Broker, opt func(*delayproxy.Config)) *testProxy {
	t.Helper()
	return startProxyWith(t, upstream(b, opt), testlog.For(t))
}

// upstream is opt (which may be nil) after setting the upstream to b.
func upstream(b testbroker.Broker, opt func(*delayproxy.Config)) func(*delayproxy.Config) {
	return func(c *delayproxy.Config) {
		c.UpstreamURL = b.URL
		if opt != nil {
			opt(c)
		}
	}
}

// startConfirmed is startProxy(t, nil) and a confirm-mode channel of a
// client connection through it.
func startConfirmed(t testing.TB) (*testProxy, *amqp.Channel) {
	t.Helper()
	return startConfirmedOn(t, testbroker.Default(t))
}

// startConfirmedOn is startConfirmed in front of broker b.
func startConfirmedOn(t testing.TB, b testbroker.Broker) (*testProxy, *amqp.Channel) {
	t.Helper()
	tp, conn := startDialledOn(t, b)
	return tp, confirmChannel(t, conn)
}

// startDialledOn is startProxyOn(t, b, nil) and a client connection
// through it.
func startDialledOn(t testing.TB, b testbroker.Broker) (*testProxy, *amqp.Connection) {
	t.Helper()
	tp := startProxyOn(t, b, nil)
	return tp, tp.dial(t)
}

// startProxyWith is startProxy with the proxy's logger and delayproxy.New's
// options.
func startProxyWith(t testing.TB, opt func(*delayproxy.Config), logger *slog.Logger, opts ...delayproxy.Option) *testProxy {
	t.Helper()
	cfg := testproxy.Config(t)
	if opt != nil {
		opt(&cfg)
	}
	tp := &testProxy{t: t, cfg: cfg, log: logger, opts: opts}
	tp.start()
	t.Cleanup(func() {
		tp.mu.Lock()
		running := tp.run != nil
		tp.mu.Unlock()
		if running {
			tp.stop()
		}
		if cfg.Store == "" { // PostgreSQL stores are checked by teststore.OpenPG
			checkStore(t, cfg.StorePath())
		}
	})
	return tp
}

// testClock is a proxy's clock in tests: the system clock moved by an
// offset, or frozen at an instant. Its timers are real: the scheduler arms
// them for durations.
type testClock struct {
	mu     sync.Mutex // guards offset and frozen
	offset time.Duration
	frozen time.Time // zero: not frozen
}

// Now implements scheduler.Clock.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		return c.frozen
	}
	return time.Now().Add(c.offset)
}

// NewTimer implements scheduler.Clock: a system timer, armed for the
// system-clock instant at which this clock will read the time asked for.
func (c *testClock) NewTimer(d time.Duration) scheduler.Timer {
	return testTimer{c, time.NewTimer(d)}
}

type testTimer struct {
	c *testClock
	t *time.Timer
}

func (t testTimer) C() <-chan time.Time  { return t.t.C }
func (t testTimer) ResetAt(at time.Time) { t.t.Reset(at.Sub(t.c.Now())) }
func (t testTimer) Stop()                { t.t.Stop() }

// freeze stops the clock at its current reading, which it returns.
func (c *testClock) freeze() time.Time {
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = now
	return now
}

// set makes the clock run again from t.
func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = time.Time{}
	c.offset = time.Until(t)
}

// at is the clock's reading at the system-clock instant t.
func (c *testClock) at(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return t.Add(c.offset)
}

// checkStore opens a stopped proxy's store and runs its integrity check.
func checkStore(t testing.TB, path string) {
	t.Helper()
	st, err := boltstore.Open(path, boltstore.Options{})
	if err != nil {
		t.Errorf("reopen store for its check: %v", err)
		return
	}
	if err := st.Check(); err != nil {
		t.Errorf("store check: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Errorf("store close: %v", err)
	}
}

func (tp *testProxy) start() {
	tp.t.Helper()
	run := testproxy.Start(tp.t, tp.cfg, tp.log, tp.opts...)
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.run, tp.amqpURL, tp.httpURL = run, run.URL(), run.HTTP()
}

// stop shuts the proxy down gracefully and checks that Run returned nil.
func (tp *testProxy) stop() {
	t := tp.t
	t.Helper()
	tp.mu.Lock()
	run := tp.run
	tp.run = nil
	tp.mu.Unlock()
	if run == nil {
		t.Fatal("stop: proxy not running")
	}
	if err := run.Stop(t, tp.cfg.ShutdownGrace+20*time.Second); err != nil {
		t.Errorf("Run returned %v, want nil after a graceful stop", err)
	}
}

// restart stops the proxy gracefully and starts it again on the same data
// dir; its addresses change.
func (tp *testProxy) restart() {
	tp.t.Helper()
	tp.stop()
	tp.start()
}

// URL is the proxy's AMQP URL, with the broker's credentials and vhost.
func (tp *testProxy) URL() string {
	u, _ := tp.urls()
	return u
}

// HTTP is the base URL of the proxy's admin and metrics server.
func (tp *testProxy) HTTP() string {
	_, u := tp.urls()
	return u
}

// urls are the AMQP and HTTP URLs of the current run.
func (tp *testProxy) urls() (amqpURL, httpURL string) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.amqpURL, tp.httpURL
}

// dial connects a client through the proxy; closed in t.Cleanup.
func (tp *testProxy) dial(t testing.TB) *amqp.Connection {
	t.Helper()
	return testbroker.Dial(t, tp.URL())
}

// confirmChannel opens a channel in confirm mode.
func confirmChannel(t testing.TB, c *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch := testbroker.Channel(t, c)
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	return ch
}

// randHex is n random bytes in hex.
func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// declareDelayed declares, through ch (a proxy channel), a durable
// x-delayed-message exchange of the given type with extra arguments, and
// deletes it on the broker in t.Cleanup.
func declareDelayed(t testing.TB, ch *amqp.Channel, typ string, extra amqp.Table) string {
	t.Helper()
	return declareDelayedOn(t, testbroker.Default(t), ch, typ, extra)
}

// declareDelayedOn is declareDelayed through a proxy in front of broker b.
func declareDelayedOn(t testing.TB, b testbroker.Broker, ch *amqp.Channel, typ string, extra amqp.Table) string {
	t.Helper()
	name := testbroker.UniqueName(t, "x")
	args := amqp.Table{"x-delayed-type": typ}
	for k, v := range extra {
		args[k] = v
	}
	if err := ch.ExchangeDeclare(name, "x-delayed-message", true, false, false, false, args); err != nil {
		t.Fatalf("declare delayed exchange %s (%s): %v", name, typ, err)
	}
	t.Cleanup(func() { b.DeleteExchange(t, name) })
	return name
}

// publish publishes one message and fails the test on a client-side error.
func publish(t testing.TB, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	if err := ch.PublishWithContext(context.Background(), exchange, key, false, false, msg); err != nil {
		t.Fatalf("publish to %s: %v", exchange, err)
	}
}

// publishConfirmed publishes on a confirm-mode channel and waits for the ack.
func publishConfirmed(t testing.TB, ch *amqp.Channel, exchange, key string, mandatory bool, msg amqp.Publishing) {
	t.Helper()
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, mandatory, false, msg)
	if err != nil {
		t.Fatalf("publish to %s: %v", exchange, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ok, err := dc.WaitContext(ctx)
	if err != nil || !ok {
		t.Fatalf("publish to %s: ack=%v err=%v", exchange, ok, err)
	}
}

// delayed is a persistent publishing with x-delay and a message-id.
func delayedMsg(delay any, id string) amqp.Publishing {
	return amqp.Publishing{
		Headers:      amqp.Table{"x-delay": delay},
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Body:         []byte("body of " + id),
	}
}

// arrival is a delivery and the wall-clock time the consumer got it.
type arrival struct {
	amqp.Delivery
	At time.Time
}

// messageIDs are the message-ids of arrivals, in arrival order.
func messageIDs(as []arrival) []string {
	ids := make([]string, len(as))
	for i, a := range as {
		ids[i] = a.MessageId
	}
	return ids
}

// consumer records every delivery of one queue with its arrival time.
type consumer struct {
	ch   *amqp.Channel
	tag  string
	mu   sync.Mutex // guards got
	got  []arrival
	more chan struct{} // signalled (capacity 1) after each arrival
	done chan struct{} // closed when the delivery channel closed
}

// delayedFanoutOn declares a delayed fanout exchange through ch (a channel
// of a proxy in front of broker b) and a queue bound to it, consumed
// straight from b.
func delayedFanoutOn(t testing.TB, b testbroker.Broker, ch *amqp.Channel) (ex, q string, cons *consumer) {
	t.Helper()
	ex, q = delayedQueueOn(t, b, ch, "fanout", "")
	return ex, q, consume(t, testbroker.Dial(t, b.URL), q)
}

// delayedQueue declares, through ch (a proxy channel), a delayed exchange
// of type typ, and on the broker a durable queue bound to it with key;
// both are deleted in t.Cleanup.
func delayedQueue(t testing.TB, ch *amqp.Channel, typ, key string) (ex, q string) {
	t.Helper()
	return delayedQueueOn(t, testbroker.Default(t), ch, typ, key)
}

// delayedQueueOn is delayedQueue through a proxy in front of broker b.
func delayedQueueOn(t testing.TB, b testbroker.Broker, ch *amqp.Channel, typ, key string) (ex, q string) {
	t.Helper()
	ex = declareDelayedOn(t, b, ch, typ, nil)
	q = b.DeclareQueue(t, true, nil)
	bindOn(t, b, q, key, ex, nil)
	return ex, q
}

// consume starts an auto-ack consumer on queue over conn (through the proxy
// or straight to the broker); it stops with the connection.
func consume(t testing.TB, conn *amqp.Connection, queue string) *consumer {
	t.Helper()
	ch := testbroker.Channel(t, conn)
	if err := ch.Qos(0, 0, false); err != nil {
		t.Fatalf("qos: %v", err)
	}
	tag := testbroker.UniqueName(t, "ctag")
	deliveries, err := ch.Consume(queue, tag, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s: %v", queue, err)
	}
	c := &consumer{ch: ch, tag: tag, more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for d := range deliveries {
			// Round(0) keeps the wall-clock reading alone, so that At is
			// compared with due times on the wall clock they are in: a
			// virtual machine's monotonic clock can run apart from it.
			at := time.Now().Round(0)
			c.mu.Lock()
			c.got = append(c.got, arrival{Delivery: d, At: at})
			c.mu.Unlock()
			select {
			case c.more <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ch.Close()
		<-c.done
	})
	return c
}

// stop cancels the consumer and returns everything it got: RabbitMQ sends
// every delivery it started before basic.cancel-ok.
func (c *consumer) stop(t testing.TB) []arrival {
	t.Helper()
	if err := c.ch.Cancel(c.tag, false); err != nil {
		t.Fatalf("basic.cancel: %v", err)
	}
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		t.Fatal("deliveries still open 15s after basic.cancel")
	}
	return c.snapshot()
}

// snapshot returns what arrived so far.
func (c *consumer) snapshot() []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

// wait returns once n messages have arrived; it fails the test after d.
func (c *consumer) wait(t testing.TB, n int, d time.Duration) []arrival {
	t.Helper()
	return c.await(t, n, d, false)
}

// drain returns once n messages have arrived; it fails the test when none
// arrives for stall. For a backlog, whose pace is the machine's.
func (c *consumer) drain(t testing.TB, n int, stall time.Duration) []arrival {
	t.Helper()
	return c.await(t, n, stall, true)
}

// await returns once n messages have arrived; it fails the test after d,
// counted from each arrival when fromArrival is set.
func (c *consumer) await(t testing.TB, n int, d time.Duration, fromArrival bool) []arrival {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	waited := "timed out after"
	if fromArrival {
		waited = "no message for"
	}
	for {
		c.mu.Lock()
		have := len(c.got)
		c.mu.Unlock()
		if have >= n {
			return c.snapshot()
		}
		select {
		case <-c.more:
			if fromArrival {
				timeout.Reset(d)
			}
		case <-c.done:
			t.Fatalf("consumer stopped after %d of %d messages", len(c.snapshot()), n)
		case <-timeout.C:
			t.Fatalf("%s %v: %d of %d messages arrived", waited, d, have, n)
		}
	}
}

// waitByID is wait by message-id (the last arrival of each).
func (c *consumer) waitByID(t testing.TB, n int, d time.Duration) map[string]arrival {
	t.Helper()
	got := map[string]arrival{}
	for _, a := range c.wait(t, n, d) {
		got[a.MessageId] = a
	}
	return got
}

// arrived is the arrival of message-id id in got (waitByID's); a missing
// one is an error of the test.
func arrived(t testing.TB, got map[string]arrival, id string) (arrival, bool) {
	t.Helper()
	a, ok := got[id]
	if !ok {
		t.Errorf("%s: never arrived", id)
	}
	return a, ok
}

// httpDo sends a request to the proxy's HTTP server and returns the status
// and body.
func (tp *testProxy) httpDo(t testing.TB, method, path string) (int, []byte) {
	t.Helper()
	return authDo(t, tp, method, path, "")
}

// exchangePath is the admin API path of a delayed exchange in vhost "/".
func exchangePath(exchange string) string {
	return exchangePathIn("/", exchange)
}

// exchangePathIn is the admin API path of a delayed exchange in vhost.
func exchangePathIn(vhost, exchange string) string {
	return "/api/exchanges/" + url.PathEscape(vhost) + "/" + url.PathEscape(exchange)
}

// getJSON GETs an admin path that must answer 200 and decodes it into v.
func getJSON(t testing.TB, tp *testProxy, path string, v any) {
	t.Helper()
	code, body := tp.httpDo(t, http.MethodGet, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, body)
	}
}

// exchangeState is the admin API's view of one delayed exchange.
type exchangeState struct {
	Pending   int64 `json:"pending"`
	NextDueMs int64 `json:"next_due_ms"`
}

// exchangeIn is the admin API's view of a delayed exchange in vhost.
func (tp *testProxy) exchangeIn(t testing.TB, vhost, exchange string) exchangeState {
	t.Helper()
	var e exchangeState
	getJSON(t, tp, exchangePathIn(vhost, exchange), &e)
	return e
}

// pending is the admin API's count of pending messages of a delayed
// exchange in vhost "/".
func (tp *testProxy) pending(t testing.TB, exchange string) int64 {
	t.Helper()
	return tp.exchangeIn(t, "/", exchange).Pending
}

// listPending lists every pending message of a delayed exchange in vhost
// "/", in release order, through the admin API's pages.
func (tp *testProxy) listPending(t testing.TB, exchange string) []admin.Message {
	t.Helper()
	key := func(m admin.Message) string { return m.Key }
	return testpaging.All(t, 1000, math.MaxInt, key, func(after string) ([]admin.Message, string) {
		path := exchangePath(exchange) + "/messages?limit=1000"
		if after != "" {
			path += "&after=" + after
		}
		var page admin.MessagePage
		getJSON(t, tp, path, &page)
		return page.Messages, page.NextAfter
	})
}

// metric reads one series from the proxy's /metrics: a family name, with
// labels in braces as the text format writes them (name{k="v",...}).
func (tp *testProxy) metric(t testing.TB, series string) float64 {
	t.Helper()
	name, rest, _ := strings.Cut(series, "{")
	var labels []string
	for pair := range strings.SplitSeq(strings.TrimSuffix(rest, "}"), ",") {
		if k, v, ok := strings.Cut(pair, "="); ok {
			labels = append(labels, k, strings.Trim(v, `"`))
		}
	}
	return scrape(t, tp).get(t, name, labels...)
}

// percentile of sorted durations, p in [0, 1].
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

// errorIs reports whether err is an *amqp.Error with the code and a reason
// containing text.
func errorIs(err error, code int, text string) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code && strings.Contains(ae.Reason, text)
}
