package bench

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testproxy"
	"github.com/delayproxy/delayproxy/internal/teststore"
)

// BenchmarkDelayedPublish_ClusterVsQuorum compares, in one run, three ways
// to have a message confirmed only once it is durable: confirmed
// persistent publishing straight to a RabbitMQ quorum queue (the
// replicated baseline), delayed messages through a delayproxy on the
// PostgreSQL store (cluster mode; x-delay 1 h), and through a delayproxy
// on its bbolt file. The shape is BenchmarkDelayedPublish_ProxyVsDirect's
// (4 publishers, 256 unconfirmed each, 64-byte bodies, rounds of 4,000
// alternating between the sides). Target: cluster/quorum >= 1.5. b.N is
// the messages per side.
func BenchmarkDelayedPublish_ClusterVsQuorum(b *testing.B) {
	const (
		publishers = 4
		window     = 256
		round      = 4000
	)
	direct := testbroker.URL(b)
	q := fmt.Sprintf("dp-bench.quorum.%d", time.Now().UnixNano())
	ch := dialChannel(b, direct)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ch.QueueDelete(q, false, false, false) })
	cfg := testproxy.Config(b)
	cfg.Store, cfg.StoreSchema = teststore.PGURL(), teststore.PGSchema(b)
	cluster, _ := startDelayProxyConfig(b, cfg)
	bbolt := startDelayProxy(b)

	delayed := amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-delay": int32(3_600_000)}}
	type side struct {
		name, url, exchange, key string
		msg                      amqp.Publishing
		pubs                     []*confirmedPublisher
		elapsed                  time.Duration
	}
	sides := []*side{
		{name: "quorum", url: direct, key: q, msg: amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent}},
		{name: "cluster", url: cluster, key: "k", msg: delayed},
		{name: "bbolt", url: bbolt, key: "k", msg: delayed},
	}
	for _, s := range sides {
		if s.name != "quorum" {
			s.exchange = declareDelayedExchange(b, dialChannel(b, s.url), "direct")
		}
		s.pubs = newConfirmedPublishers(b, s.url, publishers, window)
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += round {
		n := min(round, b.N-done)
		for _, s := range sides {
			start := time.Now()
			publishShared(b, s.pubs, s.exchange, s.key, n, func(int) amqp.Publishing { return s.msg })
			s.elapsed += time.Since(start)
		}
		if b.Failed() {
			b.FailNow()
		}
	}
	b.StopTimer()
	rate := map[string]float64{}
	for _, s := range sides {
		rate[s.name] = float64(b.N) / s.elapsed.Seconds()
		b.ReportMetric(rate[s.name], s.name+"-msgs/s")
	}
	b.ReportMetric(rate["cluster"]/rate["quorum"], "cluster/quorum")
	b.ReportMetric(rate["cluster"]/rate["bbolt"], "cluster/bbolt")
	b.ReportMetric(0, "ns/op")
}
