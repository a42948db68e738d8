package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// Graceful shutdown of the real binary (this test binary run as
// delayproxy, see TestMain) with clients connected: SIGTERM closes them
// with 320 CONNECTION_FORCED and loses no confirmed publish; a second
// signal exits at once.

// child is delayproxy run as a child process, with its addresses.
type child struct {
	*crashtest.Process
	amqpAddr string
	httpAddr string
}

// startChild runs delayproxy on dataDir in front of the test broker, with
// JSON logs and the given extra settings, and waits until /readyz answers.
// It is killed in t.Cleanup if still running.
func startChild(t *testing.T, dataDir string, extra map[string]string) *child {
	t.Helper()
	c := &child{amqpAddr: crashtest.FreePort(t), httpAddr: crashtest.FreePort(t)}
	env := map[string]string{
		"DELAYPROXY_LISTEN":         c.amqpAddr,
		"DELAYPROXY_HTTP_ADDR":      c.httpAddr,
		"DELAYPROXY_UPSTREAM":       testbroker.URL(t),
		"DELAYPROXY_DATA_DIR":       dataDir,
		"DELAYPROXY_LOG_FORMAT":     "json",
		"DELAYPROXY_SHUTDOWN_GRACE": "10s",
		// No 1 s pause of the race detector at exit: exit times are measured.
		"GORACE": strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0"),
	}
	maps.Copy(env, extra)
	c.Process = newChild(t, env)
	c.StartProbe(30*time.Second, probe(c.httpAddr, "/readyz"))
	return c
}

// url is the proxy's AMQP URL with the broker's credentials.
func (c *child) url(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = c.amqpAddr
	return u.String()
}

// waitExit waits up to d for the process to exit and returns its exit code.
func (c *child) waitExit(t *testing.T, d time.Duration) int {
	t.Helper()
	err := c.Wait(d)
	if errors.Is(err, crashtest.ErrStillRunning) {
		t.Fatalf("%v; log: %s", err, c.Tail(logLines))
	}
	return exitCode(err)
}

// terminate sends SIGTERM and waits up to d for the exit; it returns the
// exit code and how long the exit took.
func (c *child) terminate(t *testing.T, d time.Duration) (code int, took time.Duration) {
	t.Helper()
	sent := time.Now()
	c.Signal(syscall.SIGTERM)
	code = c.waitExit(t, d)
	return code, time.Since(sent)
}

// waitLog waits until the log holds s.
func (c *child) waitLog(t *testing.T, s string, d time.Duration) {
	t.Helper()
	testwait.Until(t, d, fmt.Sprintf("log line %q", s), func() bool { return c.LogContains(s) })
}

// logLines is how much of a child's log a failure shows.
const logLines = 60

// TestShutdown_ConfirmedPublishesSurviveSIGTERM: four publishers send
// confirmed delayed messages without pause; SIGTERM mid-stream closes them
// with 320 CONNECTION_FORCED and the process exits 0 within the grace
// period; after a restart on the same data dir every confirmed message is
// delivered, exactly once.
func TestShutdown_ConfirmedPublishesSurviveSIGTERM(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	a := startChild(t, dataDir, nil)
	brokerURL := testbroker.URL(t)

	// The delayed exchange goes through the proxy; its consumer straight to
	// RabbitMQ on a server-named exclusive queue, across both processes.
	ex := "dp-cmd.shutdown." + rand.Text()
	testbroker.WithChannel(t, a.url(t), func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "fanout"})
	})
	t.Cleanup(func() { testbroker.DeleteExchange(t, ex) })
	broker := testbroker.Dial(t, brokerURL)
	bch := testbroker.Channel(t, broker)
	q, err := bch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bch.QueueBind(q.Name, "", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := bch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // guards arrived
	arrived := map[string]int{}
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for d := range deliveries {
			mu.Lock()
			arrived[d.MessageId]++
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { broker.Close(); <-consumed })

	const publishers = 4
	pubs := crashtest.StartPublishers(publishers, func(i int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name:     fmt.Sprintf("dp-cmd shutdown publisher %d", i),
			URL:      func() string { return a.url(t) },
			Exchange: ex,
			Delay:    func(seq uint64) time.Duration { return time.Duration(300+(seq*37)%500) * time.Millisecond },
			Window:   8,
		}
	})
	t.Cleanup(func() { pubs.Stop() })
	// Mid-stream: once a few hundred are confirmed and releases have begun
	// (or 15 s have passed).
	arrivedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived)
	}
	deadline := time.Now().Add(15 * time.Second)
	for (pubs.Confirmed() < 300 || arrivedCount() < 50) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	arrivedBefore := arrivedCount()
	code, took := a.terminate(t, 30*time.Second)
	if code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0; log: %s", code, a.Tail(logLines))
	}
	if took > 10*time.Second {
		t.Errorf("exited %v after SIGTERM, beyond the 10s grace", took)
	}
	testwait.Until(t, 15*time.Second, "every publisher to see its connection closed", func() bool {
		return pubs.Every(func(l crashtest.Ledger) bool { return len(l.Ends) > 0 })
	})
	ledgers := pubs.Stop()

	confirmed := map[string]bool{}
	published := 0
	for i, l := range ledgers {
		if l.Hung > 0 {
			t.Errorf("publisher %d: %d publishes neither answered nor closed", i, l.Hung)
		}
		if e := l.Ends[0].Err; e == nil || e.Code != amqp.ConnectionForced {
			t.Errorf("publisher %d: connection closed with %v, want 320 CONNECTION_FORCED", i, e)
		}
		if len(l.Confirmed) == 0 {
			t.Errorf("publisher %d: nothing confirmed", i)
		}
		published += len(l.Confirmed) + len(l.Nacked) + len(l.Unanswered)
		for _, id := range l.Confirmed {
			confirmed[id] = true
		}
	}

	b := startChild(t, dataDir, nil)
	missing := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for id := range confirmed {
			if arrived[id] == 0 {
				out = append(out, id)
			}
		}
		return out
	}
	deadline = time.Now().Add(30 * time.Second)
	for len(missing()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if m := missing(); len(m) > 0 {
		t.Errorf("%d of %d confirmed messages never delivered after the restart, e.g. %v", len(m), len(confirmed), m[:min(5, len(m))])
	}
	// Whatever else is stored (unconfirmed publishes that were stored) is
	// released too; then look for duplicates.
	testwait.Until(t, 30*time.Second, "the restarted proxy to hold no message", func() bool { return pendingTotal(t, b.httpAddr) == 0 })
	time.Sleep(200 * time.Millisecond) // deliveries in flight from the last releases
	mu.Lock()
	var dups []string
	for id, n := range arrived {
		if n > 1 {
			dups = append(dups, fmt.Sprintf("%s x%d", id, n))
		}
	}
	total := len(arrived)
	mu.Unlock()
	if len(dups) > 0 {
		t.Errorf("%d messages delivered more than once across a graceful stop, e.g. %v", len(dups), dups[:min(5, len(dups))])
	}
	t.Logf("published %d, confirmed %d, delivered before SIGTERM %d, delivered in all %d (distinct); exit %v after SIGTERM",
		published, len(confirmed), arrivedBefore, total, took.Round(time.Millisecond))

	if code, _ := b.terminate(t, 30*time.Second); code != 0 {
		t.Errorf("restarted proxy: exit %d after SIGTERM, want 0; log: %s", code, b.Tail(logLines))
	}
	if a.LogContains("second signal") {
		t.Errorf("one SIGTERM logged a second signal: %s", a.Tail(logLines))
	}
}

// pendingTotal is the proxy's count of pending messages over every
// delayed exchange, from the admin API.
func pendingTotal(t *testing.T, httpAddr string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/api/exchanges")
	if err != nil {
		t.Fatalf("GET /api/exchanges: %v", err)
	}
	defer resp.Body.Close()
	var list admin.ExchangeList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK || list.Exchanges == nil {
		t.Fatalf("GET /api/exchanges: %s: %v", resp.Status, err)
	}
	return list.Pending
}

// stallConn is a client socket that can stop delivering what it reads:
// after stall, the client never sees another frame (connection.close
// included), so it never answers one. A mute one also drops what the
// client writes after stall (its heartbeats): the proxy hears nothing more.
type stallConn struct {
	net.Conn
	mute      bool
	stalled   chan struct{} // closed by stall
	closed    chan struct{} // closed by Close
	stallOnce sync.Once
	closeOnce sync.Once
}

func (c *stallConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	select {
	case <-c.stalled:
		<-c.closed
		return 0, net.ErrClosed
	default:
		return n, err
	}
}

func (c *stallConn) Write(p []byte) (int, error) {
	if c.mute {
		select {
		case <-c.stalled:
			return len(p), nil
		default:
		}
	}
	return c.Conn.Write(p)
}

func (c *stallConn) stall() { c.stallOnce.Do(func() { close(c.stalled) }) }

func (c *stallConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// dialStalled connects an amqp091-go client (heartbeat 10 s) through the
// proxy, waits until the proxy relays for it, and stalls it (mute: its
// heartbeats stop reaching the proxy too).
func dialStalled(t *testing.T, p *child, mute bool) {
	t.Helper()
	var sc *stallConn
	conn, err := amqp.DialConfig(p.url(t), amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": "dp-cmd stalled " + t.Name()},
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			sc = &stallConn{Conn: c, mute: mute, stalled: make(chan struct{}), closed: make(chan struct{})}
			return sc, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sc.Close()
		conn.Close()
	})
	// The open line: the proxy relays for it (see amqpproxy's shutdown of
	// sessions still in their handshake).
	p.waitLog(t, `"client":"`+sc.LocalAddr().String()+`"`, 10*time.Second)
	sc.stall()
}

// TestShutdown_UnansweredCloseStillExits: a client that never answers the
// shutdown's connection.close (but still sends heartbeats) does not keep
// the process past the grace period; it exits 0.
func TestShutdown_UnansweredCloseStillExits(t *testing.T) {
	t.Parallel()
	p, took := termWithStalledClient(t, false)
	if took > 15*time.Second {
		t.Errorf("exit %v after SIGTERM, beyond the 15s grace", took)
	}
	if !p.LogContains("no close-ok from client") {
		t.Errorf("the close timeout did not end the stalled client; log: %s", p.Tail(logLines))
	}
	t.Logf("exit %v after SIGTERM with a client that never answers connection.close", took.Round(time.Millisecond))
}

// termWithStalledClient runs the proxy with a 15 s grace period and a
// client that never answers connection.close (silent: nor sends
// heartbeats), sends SIGTERM and returns how long the exit took; the exit
// status must be 0.
func termWithStalledClient(t *testing.T, silent bool) (*child, time.Duration) {
	t.Helper()
	p := startChild(t, t.TempDir(), map[string]string{"DELAYPROXY_SHUTDOWN_GRACE": "15s"})
	dialStalled(t, p, silent)
	code, took := p.terminate(t, 60*time.Second)
	if code != 0 {
		t.Errorf("exit %d, want 0; log: %s", code, p.Tail(logLines))
	}
	return p, took
}

// TestShutdown_SilentClientHeldOnlyForCloseTimeout: a client that goes
// silent (no close-ok, no heartbeat) holds the shutdown for amqpproxy's
// close timeout (3 s), not until its idle timeout (2 x heartbeat) or the
// grace period.
func TestShutdown_SilentClientHeldOnlyForCloseTimeout(t *testing.T) {
	t.Parallel()
	p, took := termWithStalledClient(t, true)
	if took > 10*time.Second || p.LogContains("after the grace period") {
		t.Errorf("a silent client held the shutdown %v (close timeout 3s, heartbeat 10s, grace 15s); log: %s", took, p.Tail(logLines))
	}
	t.Logf("exit %v after SIGTERM with a silent client", took.Round(time.Millisecond))
}

// TestShutdown_SecondSignalExitsAtOnce: while a graceful shutdown waits
// for a silent client to answer connection.close (up to amqpproxy's 3 s
// close timeout, 20 s today: the window this test lives in), a second
// SIGTERM exits at once with status 1.
func TestShutdown_SecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	p := startChild(t, t.TempDir(), map[string]string{"DELAYPROXY_SHUTDOWN_GRACE": "60s"})
	dialStalled(t, p, true)
	first := time.Now()
	p.Signal(syscall.SIGTERM)
	p.waitLog(t, "signal received", 10*time.Second)
	if exited, err := p.Exited(); exited {
		t.Fatalf("exited %v after the first signal, before the second (machine too slow for the 3 s window?): %v; log: %s", time.Since(first), err, p.Tail(logLines))
	}
	second := time.Now()
	p.Signal(syscall.SIGTERM)
	code := p.waitExit(t, 10*time.Second)
	took := time.Since(second)
	if code != 1 {
		t.Errorf("exit %d after a second signal, want 1; log: %s", code, p.Tail(logLines))
	}
	if !p.LogContains("second signal") {
		t.Errorf("log lacks the second signal: %s", p.Tail(logLines))
	}
	if p.LogContains(`"msg":"stopped"`) {
		t.Errorf("the graceful shutdown finished before the second signal took effect: %s", p.Tail(logLines))
	}
	t.Logf("second signal %v after the first; exit %v after it", second.Sub(first).Round(time.Millisecond), took.Round(time.Millisecond))
}
