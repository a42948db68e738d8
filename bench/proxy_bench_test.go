package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testserver"
)

// The proxy benchmarks run the same load straight against RabbitMQ and
// through an amqpproxy.Server in the same process, one after the other, and
// report the proxy's share of the direct rate ("ratio"; target >= 0.9) and
// the latency it adds. They need RabbitMQ (AMQP_URL).

// proxyTarget is where a sub-benchmark connects.
type proxyTarget struct {
	name string
	url  string
}

// proxyTargets starts a pure-relay proxy for the benchmark and returns the
// direct and proxied URLs.
func proxyTargets(b *testing.B) []proxyTarget {
	b.Helper()
	direct := testbroker.URL(b)
	srv, err := amqpproxy.New(amqpproxy.Config{Upstream: direct, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	addr := testserver.Serve(b, srv, amqpproxy.ErrServerClosed)
	u, err := url.Parse(direct)
	if err != nil {
		b.Fatal(err)
	}
	u.Host = addr
	return []proxyTarget{{"direct", direct}, {"proxy", u.String()}}
}

// benchQueue declares a durable queue for one benchmark run, deleted at the end.
func benchQueue(b *testing.B, ch *amqp.Channel) string {
	b.Helper()
	q, err := ch.QueueDeclare(fmt.Sprintf("dp-bench.%d", time.Now().UnixNano()), true, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ch.QueueDelete(q.Name, false, false, false) })
	return q.Name
}

// dialChannel opens a channel on a fresh connection to u.
func dialChannel(b *testing.B, u string) *amqp.Channel {
	b.Helper()
	return testbroker.Channel(b, testbroker.Dial(b, u))
}

// dialConfirm opens a confirm-mode channel on a fresh connection to u.
func dialConfirm(b *testing.B, u string) *amqp.Channel {
	b.Helper()
	ch := dialChannel(b, u)
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	return ch
}

// runTargets runs f as a sub-benchmark against each proxyTarget, on a
// channel dial opens, with a fresh queue.
func runTargets(b *testing.B, dial func(*testing.B, string) *amqp.Channel, f func(b *testing.B, target string, ch *amqp.Channel, q string)) {
	for _, t := range proxyTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			ch := dial(b, t.url)
			f(b, t.name, ch, benchQueue(b, ch))
		})
	}
}

// ackN receives n deliveries from msgs and acks each.
func ackN(b *testing.B, msgs <-chan amqp.Delivery, n int) {
	b.Helper()
	for range n {
		m, ok := <-msgs
		if !ok {
			b.Fatal("consumer closed")
		}
		if err := m.Ack(false); err != nil {
			b.Fatal(err)
		}
	}
}

// rates keeps the direct rate of the latest run for the proxy run to
// compare with.
type rates struct {
	mu     sync.Mutex // guards direct
	direct float64
}

func (r *rates) report(b *testing.B, target string, perSec float64) {
	b.ReportMetric(perSec, "msgs/s")
	r.mu.Lock()
	defer r.mu.Unlock()
	if target == "direct" {
		r.direct = perSec
	} else if r.direct > 0 {
		b.ReportMetric(perSec/r.direct, "ratio")
	}
}

var payload64 = []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")

// BenchmarkProxy_ConfirmedPublish64 publishes persistent 64-byte messages
// to a durable queue in confirm mode, up to 1000 unconfirmed at a time.
// Target: ratio >= 0.9.
func BenchmarkProxy_ConfirmedPublish64(b *testing.B) {
	var r rates
	runTargets(b, dialConfirm, func(b *testing.B, target string, ch *amqp.Channel, q string) {
		const window = 1000
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
		slots := make(chan struct{}, window)
		done := make(chan error, 1)
		go func() {
			for i := 0; i < b.N; i++ {
				c, ok := <-confirms
				if !ok || !c.Ack {
					done <- fmt.Errorf("confirm %d: %+v", i, c)
					return
				}
				<-slots
			}
			done <- nil
		}()
		msg := amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent}
		ctx := context.Background()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			slots <- struct{}{}
			if err := ch.PublishWithContext(ctx, "", q, false, false, msg); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		r.report(b, target, float64(b.N)/time.Since(start).Seconds())
	})
}

// BenchmarkProxy_ConsumeManualAck64 consumes persistent 64-byte messages
// with prefetch 500 and one basic.ack per message. Target: ratio >= 0.9.
func BenchmarkProxy_ConsumeManualAck64(b *testing.B) {
	var r rates
	runTargets(b, dialChannel, func(b *testing.B, target string, ch *amqp.Channel, q string) {
		fill(b, testbroker.URL(b), q, b.N)
		if err := ch.Qos(500, 0, false); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		start := time.Now()
		msgs, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		ackN(b, msgs, b.N)
		b.StopTimer()
		r.report(b, target, float64(b.N)/time.Since(start).Seconds())
	})
}

// fill publishes n persistent 64-byte messages into q, straight to RabbitMQ.
func fill(b *testing.B, u, q string, n int) {
	b.Helper()
	ch := dialConfirm(b, u)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	msg := amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent}
	for range n {
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, msg); err != nil {
			b.Fatal(err)
		}
	}
	for range n {
		if c := <-confirms; !c.Ack {
			b.Fatalf("fill: nack %+v", c)
		}
	}
}

// BenchmarkProxy_PublishLatency measures the round trip of one confirmed
// publish (persistent, 64 bytes) at a time: p50 and p99, and on the proxy
// run the p50 the proxy adds ("added-p50-µs").
func BenchmarkProxy_PublishLatency(b *testing.B) { benchLatency(b, amqp.Persistent) }

// BenchmarkProxy_PublishLatencyTransient is the same with transient
// messages: without RabbitMQ's fsync in the round trip, the proxy's own
// share shows better.
func BenchmarkProxy_PublishLatencyTransient(b *testing.B) { benchLatency(b, amqp.Transient) }

func benchLatency(b *testing.B, mode uint8) {
	var mu sync.Mutex // guards directP50
	var directP50 time.Duration
	runTargets(b, dialConfirm, func(b *testing.B, target string, ch *amqp.Channel, q string) {
		msg := amqp.Publishing{Body: payload64, DeliveryMode: mode}
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, msg)
			if err != nil {
				b.Fatal(err)
			}
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("confirm: %v %v", ok, err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(lat)
		p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
		b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
		mu.Lock()
		defer mu.Unlock()
		if target == "direct" {
			directP50 = p50
		} else if directP50 > 0 {
			b.ReportMetric(float64((p50 - directP50).Microseconds()), "added-p50-µs")
		}
	})
}

// BenchmarkProxy_Interleaved runs the publish and consume loads in rounds of
// 2000 messages that alternate between direct and proxied, so that load
// from elsewhere on the machine hits both alike; it reports both rates and
// their ratio, round by round with its 95% confidence interval and over
// the whole run (see reportInterleaved; target >= 0.98). b.N is the number
// of messages per side: at 200,000 (100 rounds) the interval is about ±5%.
//
// ConfirmedPublish64Headers is ConfirmedPublish64 through a whole
// delayproxy (the delayed layer's hooks in place) with a headers table on
// every message that asks for no delay: the publishes that pay for the
// delivery-time headers scan.
func BenchmarkProxy_Interleaved(b *testing.B) {
	const round = 2000
	confirmedPublish := func(b *testing.B, targets []proxyTarget, msg amqp.Publishing) {
		type side struct {
			ch       *amqp.Channel
			q        string
			confirms chan amqp.Confirmation
		}
		var sides [2]side
		for i, t := range targets {
			ch := dialConfirm(b, t.url)
			q := benchQueue(b, ch)
			sides[i] = side{ch, q, ch.NotifyPublish(make(chan amqp.Confirmation, round))}
		}
		b.ResetTimer()
		reportInterleaved(b, interleave(b, round, func(i, n int) time.Duration {
			s := sides[i]
			// An empty queue at the start of every round: a queue that
			// grows through the run makes RabbitMQ stall for 100-900 ms
			// now and then, whichever side it serves.
			if _, err := s.ch.QueuePurge(s.q, false); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for range n {
				if err := s.ch.PublishWithContext(context.Background(), "", s.q, false, false, msg); err != nil {
					b.Fatal(err)
				}
			}
			for range n {
				if c := <-s.confirms; !c.Ack {
					b.Fatalf("nack %+v", c)
				}
			}
			return time.Since(start)
		}))
	}
	b.Run("ConfirmedPublish64", func(b *testing.B) {
		confirmedPublish(b, proxyTargets(b), amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent})
	})
	b.Run("ConfirmedPublish64Headers", func(b *testing.B) {
		targets := []proxyTarget{{"direct", testbroker.URL(b)}, {"delayproxy", startDelayProxy(b)}}
		confirmedPublish(b, targets, amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"trace-id": "4bf92f3577b34da6", "attempt": int32(1), "x-origin": "bench"}})
	})
	b.Run("ConsumeManualAck64", func(b *testing.B) {
		targets := proxyTargets(b)
		var chans [2]*amqp.Channel
		var queues [2]string
		for i, t := range targets {
			chans[i] = dialChannel(b, t.url)
			queues[i] = benchQueue(b, chans[i])
			if err := chans[i].Qos(500, 0, false); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		reportInterleaved(b, interleave(b, round, func(i, n int) time.Duration {
			ch := chans[i]
			b.StopTimer()
			fill(b, testbroker.URL(b), queues[i], n)
			b.StartTimer()
			start := time.Now()
			msgs, err := ch.Consume(queues[i], "bench", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			ackN(b, msgs, n)
			took := time.Since(start)
			if err := ch.Cancel("bench", false); err != nil {
				b.Fatal(err)
			}
			for range msgs { // drained when the cancel is done
			}
			return took
		}))
	})
}

// interleave runs b.N messages a side (0 direct, 1 proxied) in rounds of
// round, the sides taking turns to go first; run(i, n) does n messages on
// side i and returns how long they took. It returns each round's two
// durations.
func interleave(b *testing.B, round int, run func(i, n int) time.Duration) [][2]time.Duration {
	steal := startSteal()
	defer steal.report(b)
	var rounds [][2]time.Duration
	for done, r := 0, 0; done < b.N; done, r = done+round, r+1 {
		n := min(round, b.N-done)
		var took [2]time.Duration
		for k := range 2 {
			i := (k + r) % 2 // who goes first alternates
			took[i] = run(i, n)
		}
		rounds = append(rounds, took)
	}
	return rounds
}

// reportInterleaved reports each side's rate over the run and the proxy's
// rate as a share of direct's two ways: over the whole run (total-ratio),
// and as the geometric mean of the rounds' shares (ratio), each proxied
// round against the direct one run beside it, with the bounds of its 95%
// confidence interval (ratio-ci95-lo, -hi) from the rounds' spread.
// Rounds of confirmed persistent publishes vary by about 30% with
// RabbitMQ's syncs, so the interval says what a run can resolve.
func reportInterleaved(b *testing.B, rounds [][2]time.Duration) {
	var elapsed [2]time.Duration
	logs := make([]float64, len(rounds))
	for r, took := range rounds {
		elapsed[0] += took[0]
		elapsed[1] += took[1]
		logs[r] = math.Log(took[0].Seconds() / took[1].Seconds())
	}
	direct := float64(b.N) / elapsed[0].Seconds()
	proxy := float64(b.N) / elapsed[1].Seconds()
	mean, half := meanCI95(logs)
	b.ReportMetric(direct, "direct-msgs/s")
	b.ReportMetric(proxy, "proxy-msgs/s")
	b.ReportMetric(proxy/direct, "total-ratio")
	b.ReportMetric(math.Exp(mean), "ratio")
	b.ReportMetric(math.Exp(mean-half), "ratio-ci95-lo")
	b.ReportMetric(math.Exp(mean+half), "ratio-ci95-hi")
	b.ReportMetric(0, "ns/op")
}

// meanCI95 returns the mean of xs and the half-width of its 95% confidence
// interval (normal approximation; 0 for fewer than two values).
func meanCI95(xs []float64) (mean, half float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return mean, 1.96 * math.Sqrt(ss/float64(len(xs)-1)/float64(len(xs)))
}
