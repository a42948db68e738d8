package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// BenchmarkLoad_1000Connections: 1,000 client connections (amqp091-go)
// through one delayproxy in this process, three channels each, publish
// delayed messages (confirmed, due in 0.5-3 s) and plain ones at 2/s each
// and consume the plain ones for 15 s; then 1,000 raw connections sit idle.
// It reports, per idle connection, the proxy's goroutines, Go memory (heap
// after GC plus stacks) and RSS, and after each phase the goroutines and
// file descriptors above the baseline (0 unless something leaked). Run it
// alone, without -race:
//
//	go test -run '^$' -bench Load_1000 -benchtime 1x ./bench/
//
// Each proxied connection is a connection to RabbitMQ too, and one that
// publishes delayed messages a second one, its permission probe's: when
// RabbitMQ's file-descriptor limit (its ulimit; 1024 gives 832 sockets)
// leaves no room for 2,000, the run is sized down to what fits, leaving 100
// for everyone else, and says so ("conns"). DELAYPROXY_LOAD_CONNS
// overrides.
func BenchmarkLoad_1000Connections(b *testing.B) {
	n := 1000
	if s := os.Getenv("DELAYPROXY_LOAD_CONNS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("DELAYPROXY_LOAD_CONNS=%q: want a positive number", s)
		}
		n = v
	} else if room, limit := crashtest.BrokerRoom(b); (room-100)/2 < n {
		n = (room - 100) / 2
		b.Logf("RabbitMQ has room for %d more connections (sockets limit %d), two per proxied connection: sized down to %d", room, limit, n)
	}
	benchLoad(b, n, 15*time.Second)
}

func benchLoad(b *testing.B, n int, d time.Duration) {
	u := startDelayProxy(b)
	ch := dialChannel(b, u)
	ex := declareDelayedExchange(b, ch, "fanout")
	bch := dialChannel(b, testbroker.URL(b))
	dq, pq := benchQueue(b, bch), benchQueue(b, bch)
	if err := bch.QueueBind(dq, "", ex, false, nil); err != nil {
		b.Fatal(err)
	}
	depth := func(q string) int {
		st, err := bch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		return st.Messages
	}
	// Warm up: the releaser dials RabbitMQ at the first release and keeps
	// the connection, which belongs to the baseline.
	if err := ch.PublishWithContext(context.Background(), ex, "", false, false, amqp.Publishing{
		Headers: amqp.Table{"x-delay": 10}, Body: []byte("warm-up")}); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); depth(dq) < 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("warm-up message not released")
		}
	}
	http.DefaultClient.CloseIdleConnections()

	var rep crashtest.LoadReport
	for range b.N {
		var err error
		rep, err = crashtest.MeasureLoad(u, fmt.Sprintf("dp-bench load %d", time.Now().UnixNano()), n, crashtest.Load{
			Delayed: ex,
			Queue:   pq,
			Delay: func(seq uint64) time.Duration {
				return 500*time.Millisecond + time.Duration(seq*7919%2500)*time.Millisecond
			},
			Rate: 2,
			Body: []byte("load"),
		}, d)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.Logf("%v", rep)
	if leaks := rep.Leaks(); leaks != "" {
		b.Errorf("leaked:\n%.20000s", leaks)
	}
	if len(rep.Active.Errs) > 0 {
		b.Errorf("%d client errors, first: %v", len(rep.Active.Errs), rep.Active.Errs[0])
	}
	// Every confirmed delayed message is released (no fault: exactly once).
	want := len(rep.Active.Confirmed) + 1
	for deadline := time.Now().Add(time.Minute); depth(dq) < want; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Errorf("%d of %d confirmed delayed messages released after a minute", depth(dq)-1, want-1)
			break
		}
	}
	if got := rep.Active.Acked + depth(pq); got != rep.Active.Plain {
		b.Errorf("plain messages: %d published, %d acked or still queued", rep.Active.Plain, got)
	}
	b.ReportMetric(float64(n), "conns")
	b.ReportMetric(rep.IdleGoBytes, "go-bytes/idle-conn")
	b.ReportMetric(rep.IdleRSSBytes, "rss-bytes/idle-conn")
	b.ReportMetric(rep.IdleGoroutines, "goroutines/idle-conn")
	b.ReportMetric(float64(rep.AfterIdle.Goroutines-rep.Baseline.Goroutines), "goroutines-after")
	b.ReportMetric(float64(rep.AfterIdle.FDs-rep.Baseline.FDs), "fds-after")
	b.ReportMetric(float64(len(rep.Active.Confirmed))/d.Seconds(), "delayed-confirmed/s")
	b.ReportMetric(float64(rep.Active.Plain)/d.Seconds(), "plain/s")
	b.ReportMetric(rep.Dial.Seconds()*1000/float64(n), "ms/dial")
}
