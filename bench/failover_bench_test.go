package bench

import (
	"bufio"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// BenchmarkCluster_FailoverSIGKILL: three delayproxy processes (the real
// command, built for the run) on one PostgreSQL schema; a client publishes
// delayed messages (confirmed, due in 100-300 ms) at 200/s through the
// nodes that are up to one delayed exchange. Each iteration SIGKILLs the
// node releasing the exchange's partition and measures the time to another
// node's first confirmed release (failover-ms, target <= 2000) and to the
// other nodes' holding every partition (takeover-ms), then starts the
// killed node again. Run it alone:
//
//	go test -run '^$' -bench Cluster_Failover -benchtime 3x ./bench/
func BenchmarkCluster_FailoverSIGKILL(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "delayproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/delayproxy").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	schema := teststore.PGSchema(b)
	type node struct {
		proc       *crashtest.Process
		amqp, http string
		down       atomic.Bool
	}
	nodes := make([]*node, 3)
	for i := range nodes {
		amqpAddr, httpAddr := crashtest.FreePort(b), crashtest.FreePort(b)
		n := &node{http: "http://" + httpAddr, amqp: "amqp://guest:guest@" + amqpAddr + "/"}
		n.proc = crashtest.NewProcess(b, filepath.Join(b.TempDir(), "node.log"), bin, nil, []string{
			"DELAYPROXY_LISTEN=" + amqpAddr,
			"DELAYPROXY_HTTP_ADDR=" + httpAddr,
			"DELAYPROXY_UPSTREAM=" + testbroker.URL(b),
			"DELAYPROXY_DATA_DIR=" + b.TempDir(),
			"DELAYPROXY_STORE=" + teststore.PGURL(),
			"DELAYPROXY_STORE_SCHEMA=" + schema,
		})
		nodes[i] = n
	}
	start := func(n *node) {
		n.proc.StartProbe(time.Minute, func() error { _, err := scrapeValue(n.http, "delayproxy_releaser_role"); return err })
		n.down.Store(false)
	}
	for _, n := range nodes {
		start(n)
	}
	b.Cleanup(func() {
		for _, n := range nodes {
			if !n.down.Load() {
				n.proc.Stop(30 * time.Second)
			}
		}
	})
	value := func(n *node, name string) float64 {
		v, err := scrapeValue(n.http, name)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	// releasing is the node that is up, other than not, whose releases
	// grow past before: with one exchange, the holder of its partition.
	releasing := func(not *node, before map[*node]float64) *node {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			for _, n := range nodes {
				if n != not && !n.down.Load() && value(n, "delayproxy_messages_released_total") > before[n] {
					return n
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		b.Fatal("no node released within 30 s")
		return nil
	}
	// covered waits until the nodes up hold every partition.
	covered := func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			sum := 0.0
			for _, n := range nodes {
				if !n.down.Load() {
					sum += value(n, "delayproxy_releaser_role")
				}
			}
			if sum == pgstore.Partitions {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		b.Fatal("the nodes up did not hold every partition within 10 s")
	}
	released := func() map[*node]float64 {
		out := map[*node]float64{}
		for _, n := range nodes {
			if !n.down.Load() {
				out[n] = value(n, "delayproxy_messages_released_total")
			}
		}
		return out
	}

	ch := dialChannel(b, nodes[0].amqp)
	ex := declareDelayedExchange(b, ch, "fanout")
	bch := dialChannel(b, testbroker.URL(b))
	q := benchQueue(b, bch)
	if err := bch.QueueBind(q, "", ex, false, nil); err != nil {
		b.Fatal(err)
	}
	var next atomic.Uint64
	pubs := crashtest.StartPublishers(2, func(i int) *crashtest.Publisher {
		return &crashtest.Publisher{
			Name: fmt.Sprintf("dp-bench failover %d", i),
			URL: func() string {
				for range nodes {
					if n := nodes[next.Add(1)%uint64(len(nodes))]; !n.down.Load() {
						return n.amqp
					}
				}
				return nodes[0].amqp
			},
			Exchange: ex,
			Delay:    func(seq uint64) time.Duration { return time.Duration(100+seq%200) * time.Millisecond },
			Rate:     100,
		}
	})
	defer pubs.Stop()
	time.Sleep(2 * time.Second)

	var failover, takeover time.Duration
	b.ResetTimer()
	for range b.N {
		h := releasing(nil, released())
		before := released()
		h.down.Store(true)
		killed := time.Now()
		h.proc.Kill()
		covered()
		takeover += time.Since(killed)
		releasing(h, before)
		failover += time.Since(killed)
		start(h)
	}
	b.StopTimer()
	b.ReportMetric(float64(failover.Milliseconds())/float64(b.N), "failover-ms")
	b.ReportMetric(float64(takeover.Milliseconds())/float64(b.N), "takeover-ms")
}

// scrapeValue reads one unlabelled series from a proxy's /metrics.
func scrapeValue(httpURL, name string) (float64, error) {
	resp, err := http.Get(httpURL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s: no series %s", httpURL, name)
}
