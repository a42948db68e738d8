package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/scheduler"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// PostgreSQL store benchmarks (cluster mode), against PG_URL. Run them with
//
//	go test -run '^$' -bench 'PGStore' -benchtime 20000x ./bench/
//
// The pending messages are loaded once per count into a schema kept for
// later runs, bench_pending_<n> (INSERT ... SELECT from generate_series on
// the server, the counts and the tally built to match); a run puts its own
// messages and deletes them again, so the schema stays as it was. Set
// DELAYPROXY_BENCH_PG_PENDING to the count (default 1,000,000; 10,000,000
// takes several minutes to load and about 3 GB).

// pgPending is the number of pending messages the store benchmarks run at.
func pgPending(b *testing.B) int {
	if s := os.Getenv("DELAYPROXY_BENCH_PG_PENDING"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			b.Fatalf("DELAYPROXY_BENCH_PG_PENDING=%q: want a count", s)
		}
		return n
	}
	return 1_000_000
}

// prefilledPG opens (creating and loading it when missing) the schema with
// pending messages of exchange "/" "bench" due over the 24 h after
// storeBase+storeHorizon, 100-byte bodies.
func prefilledPG(b *testing.B, pending int, opts pgstore.Options) *pgstore.Store {
	b.Helper()
	ctx := context.Background()
	opts.Schema = fmt.Sprintf("bench_pending_%d", pending)
	s, err := pgstore.Open(ctx, teststore.PGURL(), opts)
	if err != nil {
		b.Fatal(err)
	}
	if _, ok := s.Exchange("/", "bench"); ok {
		return s
	}
	start := time.Now()
	conn, err := pgx.Connect(ctx, teststore.PGURL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	// The exchange goes in last, in the same transaction: a schema with it
	// is loaded.
	tx, err := conn.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	sc := opts.Schema
	var inc int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+sc+`.exchanges (vhost, name, kind, delayed_type, durable, auto_delete, internal, arguments)
		VALUES ('/', 'bench', 0, 'direct', true, false, false, '\x00000000') RETURNING incarnation`).Scan(&inc); err != nil {
		b.Fatal(err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		// Keys as the store makes them: the sequence (a counter far above
		// the node's) * 8 + the partition.
		{`INSERT INTO ` + sc + `.messages (part, k, incarnation, vhost, exchange, routing_key, mandatory, properties, body, delay, priority, message_id)
			SELECT $3 % 8, int8send($1 + (i * 7919) % $2) || '\xff'::bytea || int8send(((1::bigint << 58) + i) * 8 + $3 % 8),
			$3, '/', 'bench', 'rk', false, '\x8000'::bytea, convert_to(repeat('x', 100), 'UTF8'), 1000, 0, ''
			FROM generate_series(1, $4::bigint) AS i`, []any{storeBase + storeHorizon, int64(storeSpread), inc, int64(pending)}},
		{`INSERT INTO ` + sc + `.counts VALUES ($1, 0, $2)`, []any{inc, int64(pending)}},
		// The tally's shard is partition * 16 + a committer's shard.
		{`INSERT INTO ` + sc + `.tally SELECT m, ($1 % 8) * 16, count(*) FROM (SELECT (('x' || encode(substr(k, 1, 8), 'hex'))::bit(64)::bigint) / 60000 AS m
			FROM ` + sc + `.messages) AS t GROUP BY m`, []any{inc}},
	} {
		if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
			b.Fatalf("%s: %v", q.sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	_, _ = conn.Exec(ctx, `VACUUM ANALYZE `+sc+`.messages`)
	b.Logf("loaded %d pending messages into schema %s in %v", pending, sc, time.Since(start).Round(time.Second))
	_ = s.Close()
	if s, err = pgstore.Open(ctx, teststore.PGURL(), opts); err != nil {
		b.Fatal(err)
	}
	if _, ok := s.Exchange("/", "bench"); !ok {
		b.Fatal("the loaded exchange is missing")
	}
	return s
}

// BenchmarkPGStore_PutDelete measures durable Put on the PostgreSQL store
// at many pending messages: b.N 100-byte messages, one per call, due at
// random over 0-24 h, from 256 goroutines (group commits); then their
// Delete as the scheduler does it after release, 256 keys per call from 16
// goroutines. It reports both rates, messages per commit, the heap of the
// process after Open and the time Open takes (both flat in the pending
// count: a start reads no message) and the table's size.
func BenchmarkPGStore_PutDelete(b *testing.B) {
	pending := pgPending(b)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	s := prefilledPG(b, pending, pgstore.Options{})
	// A node's start reads no message: time an Open of the loaded schema.
	_ = s.Close()
	opened := time.Now()
	s, err := pgstore.Open(context.Background(), teststore.PGURL(), pgstore.Options{Schema: fmt.Sprintf("bench_pending_%d", pending)})
	if err != nil {
		b.Fatal(err)
	}
	openTime := time.Since(opened)
	defer s.Close()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if got := s.Pending(); got != int64(pending) {
		b.Fatalf("Pending %d, want %d", got, pending)
	}
	bench, _ := s.Exchange("/", "bench")
	body := make([]byte, storeBodyLen)
	ctx := context.Background()
	st0 := s.Stats()
	keys := make([]store.Key, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for w := range 256 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(b.N)))
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				delay := r.Int64N(storeSpread)
				m := &store.Message{VHost: "/", Exchange: "bench", RoutingKey: "rk", Body: body,
					Due: storeBase + storeHorizon + delay, Delay: max(delay, 1), Incarnation: bench.Incarnation}
				if err := s.Put(ctx, m); err != nil {
					failed.Store(err)
					return
				}
				keys[i] = m.Key
			}
		})
	}
	wg.Wait()
	putElapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	st1 := s.Stats()
	slices.SortFunc(keys, store.CompareKeys) // the scheduler deletes in release order
	batches := make(chan []store.Key, len(keys)/256+1)
	for i := 0; i < len(keys); i += 256 {
		batches <- keys[i:min(i+256, len(keys))]
	}
	close(batches)
	start = time.Now()
	for range 16 {
		wg.Go(func() {
			for batch := range batches {
				if err := s.Delete(ctx, batch...); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	delElapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	st2 := s.Stats()
	if got := s.Pending(); got != int64(pending) {
		b.Errorf("Pending %d after the run, want %d", got, pending)
	}
	var size int64
	_ = benchConn(b).QueryRow(ctx, `SELECT pg_total_relation_size($1)`, fmt.Sprintf("bench_pending_%d.messages", pending)).Scan(&size)
	b.ReportMetric(float64(pending), "pending")
	b.ReportMetric(float64(b.N)/putElapsed.Seconds(), "puts/s")
	b.ReportMetric(float64(b.N)/float64(max(st1.Commits-st0.Commits, 1)), "puts/commit")
	b.ReportMetric(float64(b.N)/delElapsed.Seconds(), "deletes/s")
	b.ReportMetric(float64(b.N)/float64(max(st2.Commits-st1.Commits, 1)), "deletes/commit")
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "open-heap-MiB")
	b.ReportMetric(float64(openTime.Microseconds())/1000, "open-ms")
	b.ReportMetric(float64(size)/(1<<20), "table-MiB")
	b.ReportMetric(0, "ns/op")
}

// benchConn is a connection to PG_URL for the benchmark's own queries.
func benchConn(b *testing.B) *pgx.Conn {
	b.Helper()
	conn, err := pgx.Connect(context.Background(), teststore.PGURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// BenchmarkPGStore_Announce measures how a message another node stored
// reaches this node's wheel. notify: node A puts b.N messages due soon, one
// per Put, and node B's OnNotify hears each key; it reports the percentiles
// of A's Put (call to return: the commit) and of call to B hearing the key
// (the commit plus the notification). rescan: the backstop, the scheduler
// reading its loaded horizon again (every 10 s in cluster mode): the time
// ScanKeys takes over a minute holding b.N keys, at the pending count of
// BenchmarkPGStore_PutDelete further out.
func BenchmarkPGStore_Announce(b *testing.B) {
	b.Run("notify", func(b *testing.B) {
		schema := teststore.PGSchema(b)
		type hearing struct {
			k  store.Key
			at time.Time
		}
		heard := make(chan hearing, b.N+16)
		a := teststore.OpenPG(b, schema, pgstore.Options{})
		teststore.OpenPG(b, schema, pgstore.Options{OnNotify: func(keys []pgstore.Announced) {
			now := time.Now()
			for _, a := range keys {
				heard <- hearing{a.Key, now}
			}
		}})
		d := store.ExchangeDef{VHost: "/", Name: "x", DelayedType: "direct"}
		if err := a.PutExchange(context.Background(), &d); err != nil {
			b.Fatal(err)
		}
		puts := make([]time.Duration, 0, b.N)
		hears := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			m := &store.Message{VHost: "/", Exchange: "x", Due: time.Now().UnixMilli() + 30_000, Body: []byte("x"), Incarnation: d.Incarnation}
			start := time.Now()
			if err := a.Put(context.Background(), m); err != nil {
				b.Fatal(err)
			}
			puts = append(puts, time.Since(start))
			select {
			case h := <-heard:
				if h.k != m.Key {
					b.Fatalf("heard %x, want %x (message %d)", h.k, m.Key, i)
				}
				hears = append(hears, h.at.Sub(start))
			case <-time.After(10 * time.Second):
				b.Fatalf("message %d never announced", i)
			}
		}
		b.StopTimer()
		reportPercentiles(b, "put", puts)
		reportPercentiles(b, "heard", hears)
		b.ReportMetric(0, "ns/op")
	})
	b.Run("rescan", func(b *testing.B) {
		s := prefilledPG(b, pgPending(b), pgstore.Options{})
		defer s.Close()
		bench, _ := s.Exchange("/", "bench")
		// b.N keys due within one minute, before the prefilled ones.
		due := storeBase - 2*storeHorizon
		var msgs []*store.Message
		for i := range b.N {
			msgs = append(msgs, &store.Message{VHost: "/", Exchange: "bench", Due: due + int64(i)%storeHorizon, Body: []byte("x"), Incarnation: bench.Incarnation})
			if len(msgs) == 1000 || i == b.N-1 {
				if err := s.Put(context.Background(), msgs...); err != nil {
					b.Fatal(err)
				}
				msgs = msgs[:0]
			}
		}
		var keys []store.Key
		b.ResetTimer()
		start := time.Now()
		if err := s.ScanKeys(due, due+storeHorizon, func(k store.Key) error { keys = append(keys, k); return nil }); err != nil {
			b.Fatal(err)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		if len(keys) != b.N {
			b.Fatalf("scanned %d keys, want %d", len(keys), b.N)
		}
		if err := s.Delete(context.Background(), keys...); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(elapsed.Milliseconds()), "scan-ms")
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "keys/s")
		b.ReportMetric(0, "ns/op")
	})
}

// reportPercentiles sorts ds and reports its p50, p99 and max in ms as
// "<what>-p50-ms" and so on ("p50-ms" when what is "").
func reportPercentiles(b *testing.B, what string, ds []time.Duration) {
	slices.Sort(ds)
	if what != "" {
		what += "-"
	}
	at := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))]) / 1e6 }
	b.ReportMetric(at(0.5), what+"p50-ms")
	b.ReportMetric(at(0.99), what+"p99-ms")
	b.ReportMetric(at(1), what+"max-ms")
}

// BenchmarkPGStore_Churn measures table bloat under steady release: for
// DELAYPROXY_BENCH_CHURN (default 1m; the issue asks for 10m) eight
// goroutines each put batches of 256 messages and delete the batch they put
// ten batches before, as releases do, so the pending count stays flat while
// rows churn, at DELAYPROXY_BENCH_CHURN_RATE messages a second (default
// 10,000; 0 is as fast as they go). It reports the churn rate and the size of the
// messages table (with its indexes and TOAST) at the start, its largest
// and at the end, sampled every 5 s: flat when autovacuum keeps up. When
// the server runs without autovacuum (as the shared test server does), the
// sampler runs VACUUM on the table at each sample instead, and says so.
func BenchmarkPGStore_Churn(b *testing.B) {
	d := time.Minute
	if s := os.Getenv("DELAYPROXY_BENCH_CHURN"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			b.Fatalf("DELAYPROXY_BENCH_CHURN=%q: %v", s, err)
		}
	}
	rate := 10_000.0
	if s := os.Getenv("DELAYPROXY_BENCH_CHURN_RATE"); s != "" {
		var err error
		if rate, err = strconv.ParseFloat(s, 64); err != nil || rate < 0 {
			b.Fatalf("DELAYPROXY_BENCH_CHURN_RATE=%q: want messages a second", s)
		}
	}
	schema := teststore.PGSchema(b)
	s := teststore.OpenPG(b, schema, pgstore.Options{})
	ex := store.ExchangeDef{VHost: "/", Name: "x", DelayedType: "direct"}
	ctx := context.Background()
	if err := s.PutExchange(ctx, &ex); err != nil {
		b.Fatal(err)
	}
	conn := benchConn(b)
	size := func() float64 {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT pg_total_relation_size($1)`, schema+".messages").Scan(&n); err != nil {
			b.Fatal(err)
		}
		return float64(n) / (1 << 20)
	}
	var autovacuum string
	if err := conn.QueryRow(ctx, `SHOW autovacuum`).Scan(&autovacuum); err != nil {
		b.Fatal(err)
	}
	vacuum := autovacuum != "on"
	if vacuum {
		b.Log("autovacuum is off on this server: VACUUM every 5 s instead")
	}
	startSize, maxSize := size(), 0.0
	var churned atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	stop := make(chan struct{})
	body := make([]byte, storeBodyLen)
	b.ResetTimer()
	start := time.Now()
	for w := range 8 {
		wg.Go(func() {
			var ring [][]store.Key
			for i := 0; ; i++ {
				if rate > 0 {
					// The (i*8+w)th batch of 256 starts at its share of the rate.
					at := start.Add(time.Duration(float64((i*8+w)*256) / rate * float64(time.Second)))
					select {
					case <-stop:
						return
					case <-time.After(time.Until(at)):
					}
				}
				select {
				case <-stop:
					return
				default:
				}
				msgs := make([]*store.Message, 256)
				for j := range msgs {
					msgs[j] = &store.Message{VHost: "/", Exchange: "x", RoutingKey: "rk", Body: body,
						Due: storeBase + int64(w*1_000_000+i*256+j), Delay: 1000, Incarnation: ex.Incarnation}
				}
				if err := s.Put(ctx, msgs...); err != nil {
					failed.Store(err)
					return
				}
				keys := make([]store.Key, len(msgs))
				for j, m := range msgs {
					keys[j] = m.Key
				}
				ring = append(ring, keys)
				if len(ring) > 10 {
					if err := s.Delete(ctx, ring[0]...); err != nil {
						failed.Store(err)
						return
					}
					ring = ring[1:]
					churned.Add(256)
				}
			}
		})
	}
	tick := time.NewTicker(5 * time.Second)
	for time.Since(start) < d {
		<-tick.C
		maxSize = max(maxSize, size())
		if vacuum {
			if _, err := conn.Exec(ctx, `VACUUM `+schema+`.messages`); err != nil {
				b.Fatal(err)
			}
		}
		if err, _ := failed.Load().(error); err != nil {
			break
		}
	}
	tick.Stop()
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	end := size()
	b.ReportMetric(float64(churned.Load())/elapsed.Seconds(), "released/s")
	b.ReportMetric(startSize, "start-MiB")
	b.ReportMetric(max(maxSize, end), "max-MiB")
	b.ReportMetric(end, "end-MiB")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPGStore_Drain measures the scheduler releasing from the
// PostgreSQL store, without RabbitMQ (every release confirmed at once):
// 30,000 overdue messages, the proxy's scheduler settings (batches of 256,
// 4,096 in flight, deletes lingering 20 ms). It isolates the store's part
// of release throughput (Get before each batch, ScanKeys, group-committed
// Deletes) from the broker's.
func BenchmarkPGStore_Drain(b *testing.B) {
	const pending = 30_000
	var rate float64
	for range b.N {
		b.StopTimer()
		s := teststore.OpenPG(b, teststore.PGSchema(b), pgstore.Options{})
		ex := store.ExchangeDef{VHost: "/", Name: "x", DelayedType: "direct"}
		if err := s.PutExchange(context.Background(), &ex); err != nil {
			b.Fatal(err)
		}
		var msgs []*store.Message
		for i := range pending {
			msgs = append(msgs, &store.Message{VHost: "/", Exchange: "x", RoutingKey: "rk", Body: make([]byte, 64),
				Due: storeBase + int64(i/10), Delay: 1000, Incarnation: ex.Incarnation})
			if len(msgs) == 1000 {
				if err := s.Put(context.Background(), msgs...); err != nil {
					b.Fatal(err)
				}
				msgs = nil
			}
		}
		rel := newConfirmAll()
		b.StartTimer()
		began := time.Now()
		stop := runSchedulerWith(b, s, rel, scheduler.Options{
			Clock:        scheduler.NewManualClock(time.UnixMilli(storeBase).Add(time.Hour)),
			MaxInFlight:  4096,
			DeleteLinger: 20 * time.Millisecond,
		})
		rel.waitFor(pending)
		rate += float64(pending) / time.Since(began).Seconds()
		b.StopTimer()
		stop()
		testwait.Until(b, time.Minute, "the released messages deleted", func() bool { return s.Pending() == 0 })
		b.StartTimer()
	}
	b.ReportMetric(rate/float64(b.N), "msgs/s")
	b.ReportMetric(0, "ns/op")
}
