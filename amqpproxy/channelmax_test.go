package amqpproxy

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestChannelMaxIsRabbitMQs: the client is offered RabbitMQ's own
// connection.tune (channel_max, frame_max; the heartbeat is the proxy's
// setting), amqp091-go negotiates RabbitMQ's channel_max, and the last
// channel number RabbitMQ allows opens through the proxy. On RabbitMQ 3.10
// and 4.3.
func TestChannelMaxIsRabbitMQs(t *testing.T) {
	t.Parallel()
	testbroker.Each(t, func(t *testing.T, b testbroker.Broker) {
		direct := offeredTune(t, b.Addr(t))
		p := startProxyOn(t, b, Config{})
		got := offeredTune(t, p.addr)
		if got.ChannelMax != direct.ChannelMax || got.FrameMax != direct.FrameMax {
			t.Fatalf("the proxy offers channel_max %d frame_max %d, RabbitMQ %d %d",
				got.ChannelMax, got.FrameMax, direct.ChannelMax, direct.FrameMax)
		}
		conn := p.dial(t, amqp.Config{})
		if conn.Config.ChannelMax != direct.ChannelMax {
			t.Fatalf("amqp091-go negotiated channel_max %d through the proxy, RabbitMQ offers %d", conn.Config.ChannelMax, direct.ChannelMax)
		}
		c := rawDial(t, p.addr)
		c.open(rawLogin{}) // takes the offered channel_max
		last := direct.ChannelMax
		c.send(last, &wire.ChannelOpen{})
		c.expect(last, wire.IDChannelOpenOk)
		c.send(last, &wire.BasicQos{PrefetchCount: 1})
		c.expect(last, wire.IDBasicQosOk)
		t.Logf("RabbitMQ %s: channel_max %d, frame_max %d", b.Name, direct.ChannelMax, direct.FrameMax)
	})
}
