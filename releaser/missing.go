package releaser

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// MissingChecks bounds the attempts at releasing a delivery-time message
// (store.KindDeliveryTime) whose exchange RabbitMQ no longer has: after the
// release that met 404 NOT_FOUND, the exchange is checked with a passive
// exchange.declare before each retry, and when it was found missing this
// many times in a row the message is dropped: reported confirmed, so it
// leaves the store, and counted and logged as unroutable. Such exchanges
// are never declared by the proxy, unlike delayed exchanges. Once an
// exchange reached the bound, a later message of it is dropped at the
// first check that finds it missing; a check that finds it resets the
// count.
const MissingChecks = 3

// exchangeID names an exchange of a vhost.
type exchangeID struct{ vhost, name string }

// noteMissing records, after a release met 404, the delivery-time
// exchanges of the unconfirmed messages batch[i], i in idx: they are
// checked before the next release. It returns the indexes of the others,
// whose exchanges may be declared again.
func (r *Releaser) noteMissing(vhost string, batch []*store.Message, idx []int, confirmed []bool) (rest []int) {
	for _, i := range idx {
		if confirmed[i] {
			continue
		}
		name := batch[i].Exchange
		if def, ok := r.lookup(vhost, name); !ok || def.Kind != store.KindDeliveryTime {
			rest = append(rest, i)
			continue
		}
		id := exchangeID{vhost, name}
		r.mu.Lock()
		_, known := r.missing[id]
		if !known {
			r.missing[id] = 0
		}
		r.mu.Unlock()
		if !known {
			r.cfg.Logger.Warn("exchange of delivery-time messages not found at release; it is not declared by the proxy",
				"vhost", vhost, "exchange", name, "checks before dropping", MissingChecks)
		}
	}
	return rest
}

func (r *Releaser) lookup(vhost, name string) (store.ExchangeDef, bool) {
	if r.cfg.Registry == nil {
		return store.ExchangeDef{}, false
	}
	return r.cfg.Registry.Exchange(vhost, name)
}

// dropMissing checks, once per batch, each exchange of batch[idx] that a
// release found missing, and returns the indexes to publish: a message
// whose exchange is still missing is held back (unconfirmed: the scheduler
// retries it), or dropped once the exchange was found missing
// MissingChecks times in a row.
func (r *Releaser) dropMissing(ctx context.Context, c *conn, vhost string, batch []*store.Message, idx []int, confirmed []bool) []int {
	r.mu.Lock()
	n := len(r.missing)
	r.mu.Unlock()
	if n == 0 {
		return idx
	}
	verdicts := map[string]verdict{}
	kept := make([]int, 0, len(idx))
	for _, i := range idx {
		m := batch[i]
		v, seen := verdicts[m.Exchange]
		if !seen {
			v = r.checkMissing(ctx, c, exchangeID{vhost, m.Exchange})
			verdicts[m.Exchange] = v
		}
		switch {
		case v.drop:
			confirmed[i] = true
			if r.cfg.Metrics != nil {
				r.cfg.Metrics.Unroutable(1)
			}
			r.cfg.Logger.Warn("delivery-time message dropped: its exchange no longer exists in RabbitMQ",
				"vhost", vhost, "exchange", m.Exchange, "routing_key", m.RoutingKey, "message_id", m.MessageID,
				"key", fmt.Sprintf("%x", m.Key[:]), "checks", MissingChecks)
		case !v.hold:
			kept = append(kept, i)
		}
	}
	return kept
}

// verdict is what checkMissing decided for an exchange's messages: hold
// them back, drop them, or (neither) publish them.
type verdict struct{ hold, drop bool }

// checkMissing decides for the messages of one exchange in a batch:
// publish (not suspected, or found), hold back, or drop.
func (r *Releaser) checkMissing(ctx context.Context, c *conn, id exchangeID) (v verdict) {
	r.mu.Lock()
	_, suspect := r.missing[id]
	r.mu.Unlock()
	if !suspect {
		return v
	}
	found, err := c.exists(ctx, id.name, r.cfg.DialTimeout)
	r.mu.Lock()
	switch {
	case err != nil:
		v.hold = true // the check failed, not the exchange: the next retry checks again
	case found:
		delete(r.missing, id)
	default:
		r.missing[id]++
		v.drop = r.missing[id] >= MissingChecks
		v.hold = !v.drop
	}
	r.mu.Unlock()
	if found {
		r.cfg.Logger.Info("exchange of delivery-time messages found again", "vhost", id.vhost, "exchange", id.name)
	}
	return v
}

// exists reports whether RabbitMQ has the exchange, with a passive
// exchange.declare on declareChannel (404 closes that channel only). A call
// that gets no answer within timeout ends the connection.
func (c *conn) exists(ctx context.Context, name string, timeout time.Duration) (bool, error) {
	c.declareMu.Lock()
	defer c.declareMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.call(ctx, &wire.ChannelOpen{}, wire.IDChannelOpenOk); err != nil {
		return false, err
	}
	err := c.call(ctx, &wire.ExchangeDeclare{Exchange: name, Passive: true}, wire.IDExchangeDeclareOk)
	var we *wire.Error
	if errors.As(err, &we) && we.Code == wire.NotFound {
		return false, nil // the channel is closed, close-ok answered
	}
	if err != nil {
		return false, err
	}
	return true, c.call(ctx, &wire.ChannelClose{ReplyCode: wire.ReplySuccess, ReplyText: "Goodbye"}, wire.IDChannelCloseOk)
}
