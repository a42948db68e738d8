package releaser

import (
	"context"
	"fmt"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// redeclare declares again, from the registry, the real exchanges of the
// messages batch[i], i in idx: RabbitMQ closed the release channel with
// 404 NOT_FOUND, so one of them is gone upstream while the registry still
// has its delayed exchange.
func (r *Releaser) redeclare(ctx context.Context, vhost string, batch []*store.Message, idx []int) {
	if r.cfg.Registry == nil {
		return
	}
	seen := map[string]bool{}
	for _, i := range idx {
		name := batch[i].Exchange
		if seen[name] {
			continue
		}
		seen[name] = true
		def, ok := r.cfg.Registry.Exchange(vhost, name)
		if !ok || def.Kind != store.KindDelayed {
			continue // never declare an exchange of delivery-time messages
		}
		c, err := r.conn(ctx, vhost)
		if err == nil {
			err = c.declare(ctx, def, r.cfg.DialTimeout)
		}
		if err != nil {
			r.cfg.Logger.Warn("cannot declare missing exchange again", "vhost", vhost, "exchange", name, "err", err)
			continue
		}
		r.cfg.Logger.Info("declared missing exchange again from the registry", "vhost", vhost, "exchange", name, "type", def.DelayedType)
	}
}

// declare declares the real exchange of a delayed exchange on
// declareChannel, opened for it and closed after: a refusal closes that
// channel, not the release channel. The real exchange carries the declared
// arguments, x-delayed-type included, byte for byte as the client declared
// them. A call that gets no answer within timeout ends the connection.
func (c *conn) declare(ctx context.Context, def store.ExchangeDef, timeout time.Duration) error {
	c.declareMu.Lock()
	defer c.declareMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.call(ctx, &wire.ChannelOpen{}, wire.IDChannelOpenOk); err != nil {
		return err
	}
	err := c.call(ctx, &wire.ExchangeDeclare{Exchange: def.Name, Type: def.DelayedType, Durable: def.Durable,
		AutoDelete: def.AutoDelete, Internal: def.Internal, Arguments: wire.Table(def.Arguments)}, wire.IDExchangeDeclareOk)
	if err != nil {
		return err // a refusal closed the channel, and the reader answered close-ok
	}
	return c.call(ctx, &wire.ChannelClose{ReplyCode: wire.ReplySuccess, ReplyText: "Goodbye"}, wire.IDChannelCloseOk)
}

// call sends m on declareChannel and waits for the answer want.
func (c *conn) call(ctx context.Context, m wire.Method, want wire.MethodID) error {
	if err := c.send(declareChannel, m); err != nil {
		return err
	}
	select {
	case r := <-c.replies:
		if r.err != nil {
			return r.err
		}
		if r.id != want {
			err := fmt.Errorf("%v answered with %v", m.ID(), r.id)
			c.abort(err)
			return err
		}
		return nil
	case <-c.dead:
		return c.err
	case <-ctx.Done():
		err := fmt.Errorf("no answer to %v: %w", m.ID(), ctx.Err())
		c.abort(err)
		return err
	}
}
