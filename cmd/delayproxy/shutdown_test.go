package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// Graceful shutdown of the real binary (this test binary run as
// delayproxy, see TestMain) with clients connected: SIGTERM closes them
// with 320 CONNECTION_FORCED and loses no confirmed publish; a second
// signal exits at once.

// syncBuffer collects a process's output; safe to read while it runs.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a running delayproxy process.
type proc struct {
	cmd      *exec.Cmd
	log      *syncBuffer // stderr: JSON log lines
	exited   chan struct{}
	waitErr  error // Wait's result; read after exited is closed
	amqpAddr string
	httpAddr string
}

// startProc runs delayproxy on dataDir in front of the test broker, with
// JSON logs and the given extra settings, and waits until /readyz answers.
// It is killed in t.Cleanup if still running.
func startProc(t *testing.T, dataDir string, extra map[string]string) *proc {
	t.Helper()
	p := &proc{
		log:      &syncBuffer{},
		exited:   make(chan struct{}),
		amqpAddr: "127.0.0.1:" + freePort(t),
		httpAddr: "127.0.0.1:" + freePort(t),
	}
	env := map[string]string{
		"DELAYPROXY_LISTEN":         p.amqpAddr,
		"DELAYPROXY_HTTP_ADDR":      p.httpAddr,
		"DELAYPROXY_UPSTREAM":       testbroker.URL(t),
		"DELAYPROXY_DATA_DIR":       dataDir,
		"DELAYPROXY_LOG_FORMAT":     "json",
		"DELAYPROXY_SHUTDOWN_GRACE": "10s",
		// No 1 s pause of the race detector at exit: exit times are measured.
		"GORACE": strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0"),
	}
	for k, v := range extra {
		env[k] = v
	}
	cmd, _, _ := command(t, env)
	cmd.Stderr = p.log
	p.cmd = cmd
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := admin.Probe(ctx, p.httpAddr, "/readyz")
		cancel()
		if err == nil {
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("delayproxy exited at start: %v; log: %s", p.waitErr, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after 30s: %v; log: %s", err, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// url is the proxy's AMQP URL with the broker's credentials.
func (p *proc) url(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testbroker.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.amqpAddr
	return u.String()
}

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits up to d for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return exitCode(p.waitErr)
	case <-time.After(d):
		t.Fatalf("still running after %v; log: %s", d, p.log)
	}
	return -1
}

// waitLog waits until the log holds s.
func (p *proc) waitLog(t *testing.T, s string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.log.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("log lacks %q after %v: %s", s, d, p.log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func randName(t *testing.T, prefix string) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// publisher's outcome.
type pubResult struct {
	published int
	confirmed []string    // message-ids the proxy acked
	closeErr  *amqp.Error // what the connection was closed with
	err       error       // a failure other than the close
}

// publishUntilClosed publishes confirmed delayed messages (300-800 ms) to
// ex, keeping up to 8 unconfirmed, until the connection closes or stop is
// closed; each acked message-id goes to confirmed and bumps count.
func publishUntilClosed(proxyURL, ex string, n int, stop <-chan struct{}, count *atomic.Int64) pubResult {
	var r pubResult
	conn, err := amqp.DialConfig(proxyURL, amqp.Config{Properties: amqp.Table{"connection_name": fmt.Sprintf("dp-cmd shutdown publisher %d", n)}})
	if err != nil {
		r.err = err
		return r
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		r.err = err
		return r
	}
	type inflight struct {
		id string
		dc *amqp.DeferredConfirmation
	}
	var window []inflight
	settle := func(w inflight) {
		if w.dc.Wait() {
			r.confirmed = append(r.confirmed, w.id)
			count.Add(1)
		}
	}
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			r.err = errors.New("stopped before the connection closed")
			return r
		default:
		}
		id := fmt.Sprintf("p%d-%d", n, seq)
		dc, err := ch.PublishWithDeferredConfirm(ex, "", false, false, amqp.Publishing{
			Headers:      amqp.Table{"x-delay": int32(300 + (seq*37)%500)},
			DeliveryMode: amqp.Persistent,
			MessageId:    id,
			Body:         []byte(id),
		})
		if err != nil {
			break // closed
		}
		r.published++
		window = append(window, inflight{id, dc})
		if len(window) >= 8 {
			settle(window[0])
			window = window[1:]
		}
	}
	for _, w := range window {
		settle(w) // acked, or false once the channel closed
	}
	select {
	case r.closeErr = <-closed:
	case <-time.After(15 * time.Second):
		r.err = errors.New("publish failed but the connection did not report its close")
	}
	return r
}

// TestShutdown_ConfirmedPublishesSurviveSIGTERM: four publishers send
// confirmed delayed messages without pause; SIGTERM mid-stream closes them
// with 320 CONNECTION_FORCED and the process exits 0 within the grace
// period; after a restart on the same data dir every confirmed message is
// delivered, exactly once.
func TestShutdown_ConfirmedPublishesSurviveSIGTERM(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	a := startProc(t, dataDir, nil)
	brokerURL := testbroker.URL(t)

	// The delayed exchange goes through the proxy; its consumer straight to
	// RabbitMQ on a server-named exclusive queue, across both processes.
	ex := randName(t, "dp-cmd.shutdown.")
	setup, err := amqp.Dial(a.url(t))
	if err != nil {
		t.Fatal(err)
	}
	sch, err := setup.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "fanout"}); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	broker, err := amqp.Dial(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := broker.Channel(); err == nil {
			_ = ch.ExchangeDelete(ex, false, false)
		}
		broker.Close()
	})
	bch, err := broker.Channel()
	if err != nil {
		t.Fatal(err)
	}
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
	stop := make(chan struct{})
	var stopOnce sync.Once
	t.Cleanup(func() { stopOnce.Do(func() { close(stop) }) })
	var confirmedCount atomic.Int64
	results := make([]pubResult, publishers)
	var wg sync.WaitGroup
	for i := range publishers {
		wg.Go(func() { results[i] = publishUntilClosed(a.url(t), ex, i, stop, &confirmedCount) })
	}
	// Mid-stream: once a few hundred are confirmed and releases have begun
	// (or 15 s have passed).
	arrivedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived)
	}
	deadline := time.Now().Add(15 * time.Second)
	for (confirmedCount.Load() < 300 || arrivedCount() < 50) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	arrivedBefore := arrivedCount()
	sent := time.Now()
	a.signal(t, syscall.SIGTERM)
	code := a.wait(t, 30*time.Second)
	took := time.Since(sent)
	if code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0; log: %s", code, a.log)
	}
	if took > 10*time.Second {
		t.Errorf("exited %v after SIGTERM, beyond the 10s grace", took)
	}
	wg.Wait()

	confirmed := map[string]bool{}
	published := 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("publisher %d: %v", i, r.err)
		}
		if r.closeErr == nil || r.closeErr.Code != amqp.ConnectionForced {
			t.Errorf("publisher %d: connection closed with %v, want 320 CONNECTION_FORCED", i, r.closeErr)
		}
		if len(r.confirmed) == 0 {
			t.Errorf("publisher %d: nothing confirmed", i)
		}
		published += r.published
		for _, id := range r.confirmed {
			confirmed[id] = true
		}
	}

	b := startProc(t, dataDir, nil)
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
	deadline = time.Now().Add(30 * time.Second)
	for pendingTotal(t, b.httpAddr) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("restarted proxy still holds %d messages after 30s", pendingTotal(t, b.httpAddr))
		}
		time.Sleep(20 * time.Millisecond)
	}
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

	b.signal(t, syscall.SIGTERM)
	if code := b.wait(t, 30*time.Second); code != 0 {
		t.Errorf("restarted proxy: exit %d after SIGTERM, want 0; log: %s", code, b.log)
	}
	if strings.Contains(a.log.String(), "second signal") {
		t.Errorf("one SIGTERM logged a second signal: %s", a.log)
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
	var r struct {
		Pending *int64 `json:"pending"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.Pending == nil {
		t.Fatalf("GET /api/exchanges: %s: %v", resp.Status, err)
	}
	return *r.Pending
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
func dialStalled(t *testing.T, p *proc, mute bool) {
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
	if !strings.Contains(p.log.String(), "no close-ok from client") {
		t.Errorf("the close timeout did not end the stalled client; log: %s", p.log)
	}
	t.Logf("exit %v after SIGTERM with a client that never answers connection.close", took.Round(time.Millisecond))
}

// termWithStalledClient runs the proxy with a 15 s grace period and a
// client that never answers connection.close (silent: nor sends
// heartbeats), sends SIGTERM and returns how long the exit took; the exit
// status must be 0.
func termWithStalledClient(t *testing.T, silent bool) (*proc, time.Duration) {
	t.Helper()
	p := startProc(t, t.TempDir(), map[string]string{"DELAYPROXY_SHUTDOWN_GRACE": "15s"})
	dialStalled(t, p, silent)
	sent := time.Now()
	p.signal(t, syscall.SIGTERM)
	code := p.wait(t, 60*time.Second)
	took := time.Since(sent)
	if code != 0 {
		t.Errorf("exit %d, want 0; log: %s", code, p.log)
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
	if took > 10*time.Second || strings.Contains(p.log.String(), "after the grace period") {
		t.Errorf("a silent client held the shutdown %v (close timeout 3s, heartbeat 10s, grace 15s); log: %s", took, p.log)
	}
	t.Logf("exit %v after SIGTERM with a silent client", took.Round(time.Millisecond))
}

// TestShutdown_SecondSignalExitsAtOnce: while a graceful shutdown waits
// for a silent client to answer connection.close (up to amqpproxy's 3 s
// close timeout, 20 s today: the window this test lives in), a second
// SIGTERM exits at once with status 1.
func TestShutdown_SecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	p := startProc(t, t.TempDir(), map[string]string{"DELAYPROXY_SHUTDOWN_GRACE": "60s"})
	dialStalled(t, p, true)
	first := time.Now()
	p.signal(t, syscall.SIGTERM)
	p.waitLog(t, "signal received", 10*time.Second)
	select {
	case <-p.exited:
		t.Fatalf("exited %v after the first signal, before the second (machine too slow for the 3 s window?): %v; log: %s", time.Since(first), p.waitErr, p.log)
	default:
	}
	second := time.Now()
	p.signal(t, syscall.SIGTERM)
	code := p.wait(t, 10*time.Second)
	took := time.Since(second)
	if code != 1 {
		t.Errorf("exit %d after a second signal, want 1; log: %s", code, p.log)
	}
	if !strings.Contains(p.log.String(), "second signal") {
		t.Errorf("log lacks the second signal: %s", p.log)
	}
	if strings.Contains(p.log.String(), `"msg":"stopped"`) {
		t.Errorf("the graceful shutdown finished before the second signal took effect: %s", p.log)
	}
	t.Logf("second signal %v after the first; exit %v after it", second.Sub(first).Round(time.Millisecond), took.Round(time.Millisecond))
}
