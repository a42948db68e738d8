package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// childEnv marks the test binary re-executed as a proxy process.
const childEnv = "DELAYPROXY_RELIABILITY_CHILD"

// TestReliabilityChildProxy is not a test of its own: it is the proxy
// process that TestReliabilityCrash_SIGKILLRounds runs and kills, the test
// binary re-executed with childEnv set. It reads its settings from the
// DELAYPROXY_* environment as the command does, writes crashtest's ready
// line with its addresses, and stops gracefully on SIGTERM; goleak then
// checks that a graceful stop after crashes leaks nothing.
func TestReliabilityChildProxy(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		return // only as a child process
	}
	cfg, err := delayproxy.LoadConfig(nil, os.Getenv, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := delayproxy.New(cfg, cfg.NewLogger(os.Stderr))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
		amqpAddr, httpAddr := p.Addrs()
		fmt.Printf("%samqp=%s http=%s\n", crashtest.ReadyPrefix, amqpAddr, httpAddr)
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestReliabilityCrash_SIGKILLRounds: clients publish confirmed delayed
// messages through a proxy process that is killed with SIGKILL at random
// moments and started again on the same data dir, while earlier messages
// are being released. Every message a client saw confirmed is delivered;
// duplicates stay within the release window per crash.
//
// SIGKILL loses the process, not the page cache: this proves the store
// and the release protocol consistent across process crashes, not fsync
// against power loss (the store's own crash tests cover what bbolt sees).
func TestReliabilityCrash_SIGKILLRounds(t *testing.T) {
	t.Parallel()
	const (
		clients = 4
		rounds  = 4
	)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)

	dataDir := t.TempDir()
	amqpAddr, httpAddr := crashtest.FreePort(t), crashtest.FreePort(t)
	upstream := testbroker.URL(t)
	proc := crashtest.NewProcess(t, filepath.Join(t.TempDir(), "proxy.log"), os.Args[0],
		[]string{"-test.run=^TestReliabilityChildProxy$"},
		[]string{
			childEnv + "=1",
			"DELAYPROXY_LISTEN=" + amqpAddr,
			"DELAYPROXY_HTTP_ADDR=" + httpAddr,
			"DELAYPROXY_UPSTREAM=" + upstream,
			"DELAYPROXY_DATA_DIR=" + dataDir,
			"DELAYPROXY_SHUTDOWN_GRACE=10s",
		})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy log (last lines):\n%s", proc.Tail(60))
		}
	})
	started := time.Now()
	proc.Start(time.Minute)
	t.Logf("proxy process ready in %v", time.Since(started))
	// A view of the child for the e2e helpers that need only its URLs.
	tp := &testProxy{t: t, amqpURL: withHost(t, upstream, amqpAddr, ""), httpURL: "http://" + httpAddr}

	ch := testbroker.Channel(t, tp.dial(t))
	ex, q := delayedQueue(t, ch, "fanout", "")
	got := consume(t, testbroker.Dial(t, testbroker.URL(t)), q)

	tag := randHex(t, 4)
	pubs := crashtest.StartPublishers(clients, func(i int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name:     fmt.Sprintf("dp-rel crash %s %d", tag, i),
			URL:      tp.URL,
			Exchange: ex,
			// Most due while the test runs (released between and
			// during crashes), some after the last crash.
			Delay:  delaySpread(seed+uint64(i), 500*time.Millisecond, 3*time.Second, 4*time.Second, 3*time.Second),
			Window: 32,
			Rate:   150,
		}
	})
	for r := range rounds {
		base := pubs.Confirmed()
		testwait.Until(t, 30*time.Second, "clients to publish again after the restart", func() bool {
			return pubs.Confirmed() >= base+50
		})
		// A random moment: the point of the test.
		time.Sleep(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
		atKill := pubs.Confirmed()
		proc.Kill()
		killed := time.Now()
		proc.Start(time.Minute)
		t.Logf("round %d: SIGKILL with %d confirmed so far; restarted and ready in %v", r+1, atKill, time.Since(killed))
	}
	base := pubs.Confirmed()
	testwait.Until(t, 30*time.Second, "clients to publish after the last restart", func() bool {
		return pubs.Confirmed() >= base+50
	})
	ls := pubs.Stop()
	awaitDelivered(t, got, pubs, 7*time.Second+30*time.Second)
	testwait.Until(t, 30*time.Second, "nothing pending", func() bool { return tp.pending(t, ex) == 0 })
	tally := crashtest.Count(ls, messageIDs(got.stop(t)))
	sessions := 0
	for _, l := range ls {
		sessions += l.Sessions
	}
	t.Logf("%d clients, %d SIGKILLs, %d client connections: %v", clients, rounds, sessions, tally)
	if err := tally.Err(rounds * releaseWindow); err != nil {
		t.Error(err)
	}
	if tally.Nacked > 0 {
		t.Errorf("%d publishes nacked: a crash must cut the answer off, not refuse", tally.Nacked)
	}
	if sessions < clients*(rounds+1) {
		t.Errorf("%d client connections, want at least %d (one per client per run of the proxy)", sessions, clients*(rounds+1))
	}

	if err := proc.Stop(30 * time.Second); err != nil {
		t.Errorf("graceful stop after the crashes: %v", err)
	}
	if proc.LogContains("DATA RACE") {
		t.Error("the race detector reported a race in the proxy process (see its log)")
	}
	checkStore(t, filepath.Join(dataDir, delayproxy.StoreFile))
}
