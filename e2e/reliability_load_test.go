package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestReliabilityLoad_200Connections: 200 client connections, three
// channels each, publish delayed and plain messages and consume for 5 s
// through one proxy; then 200 raw connections sit idle. After each phase
// the proxy's goroutines and file descriptors come back to what they were
// before (in this process: no parallel test runs meanwhile), every
// confirmed delayed message is released, and every plain message published
// is either acked by a consumer or still in its queue. The figures per idle
// connection are logged; bench.BenchmarkLoad_1000Connections is the
// measuring run.
//
// Not parallel: it counts goroutines and descriptors process-wide.
func TestReliabilityLoad_200Connections(t *testing.T) {
	const (
		n = 200
		d = 5 * time.Second
	)
	tp := startProxy(t, nil)
	setup := tp.dial(t)
	ex, dq := delayedQueue(t, testbroker.Channel(t, setup), "fanout", "")
	pq := testbroker.DeclareQueue(t, true, nil)
	broker := testbroker.Dial(t, testbroker.URL(t))
	got := consume(t, broker, dq)
	inspect := testbroker.Channel(t, broker)
	// Warm up: the releaser's connection is dialled at the first release
	// and stays, so it belongs to the baseline.
	publishConfirmed(t, confirmChannel(t, setup), ex, "", false, delayedMsg(int32(10), "warm-up"))
	got.wait(t, 1, 30*time.Second)
	http.DefaultClient.CloseIdleConnections()

	rep, err := crashtest.MeasureLoad(tp.URL(), "dp-rel load "+randHex(t, 4), n, crashtest.Load{
		Delayed: ex,
		Queue:   pq,
		Delay:   delaySpread(1, 200*time.Millisecond, time.Second, time.Second, time.Second),
		Rate:    2,
		Body:    []byte("load"),
	}, d)
	if err != nil {
		// Each client is a connection to RabbitMQ too.
		t.Fatalf("%v (does RabbitMQ have room for %d more connections? see `rabbitmqctl status`, File Descriptors)", err, n)
	}
	t.Logf("%v", rep)
	if leaks := rep.Leaks(); leaks != "" {
		t.Fatalf("leaked:\n%.20000s", leaks)
	}
	if errs := rep.Active.Errs; len(errs) > 0 {
		t.Errorf("%d client errors, first: %v", len(errs), errs[0])
	}
	if rep.Active.Nacked > 0 {
		t.Errorf("%d delayed publishes nacked", rep.Active.Nacked)
	}
	if rep.Active.Silent > 0 {
		t.Errorf("%d of %d connections got no delayed publish confirmed", rep.Active.Silent, n)
	}
	if g := rep.IdleGoroutines; g < 1 || g > 8 {
		t.Errorf("%.1f goroutines per idle connection, want a few (the design says 4)", g)
	}
	awaitLedger(t, got, crashtest.Ledger{Confirmed: rep.Active.Confirmed}, 30*time.Second)
	left, err := inspect.QueueDeclarePassive(pq, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Active.Acked+left.Messages != rep.Active.Plain {
		t.Errorf("plain messages: %d published, %d acked + %d in the queue", rep.Active.Plain, rep.Active.Acked, left.Messages)
	}
	tally := crashtest.Count([]crashtest.Ledger{{Confirmed: append(rep.Active.Confirmed, "warm-up")}}, messageIDs(got.snapshot()))
	if err := tally.Err(0); err != nil {
		t.Error(err)
	}
}
