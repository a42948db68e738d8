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

	rate := publishRounds(b, publishers, window, []*publishSide{
		{name: "quorum", url: direct, key: q, msg: amqp.Publishing{Body: payload64, DeliveryMode: amqp.Persistent}},
		{name: "cluster", url: cluster, exchange: declareDelayedExchange(b, dialChannel(b, cluster), "direct"), key: "k", msg: delayedHour},
		{name: "bbolt", url: bbolt, exchange: declareDelayedExchange(b, dialChannel(b, bbolt), "direct"), key: "k", msg: delayedHour},
	})
	b.ReportMetric(rate["cluster"]/rate["quorum"], "cluster/quorum")
	b.ReportMetric(rate["cluster"]/rate["bbolt"], "cluster/bbolt")
}
