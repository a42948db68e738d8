package delayed

import (
	"fmt"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// Exchange type and argument of the delayed-message plugin's API.
const (
	TypeDelayed    = "x-delayed-message"
	argDelayedType = "x-delayed-type"
)

// realDeclare checks a non-passive declare of an x-delayed-message exchange
// and returns the declare the proxy sends upstream: the same exchange with
// the underlying type from x-delayed-type, arguments unchanged (x-delayed-type
// included), and nowait off, since the proxy records the exchange only once
// RabbitMQ has declared it. Errors carry the plugin's codes and texts.
func realDeclare(m *wire.ExchangeDeclare) (wire.ExchangeDeclare, error) {
	v, ok, err := m.Arguments.Get(argDelayedType)
	if err != nil {
		return wire.ExchangeDeclare{}, err // the codec's 501
	}
	typ, isString := v.(string)
	if b, isBytes := v.([]byte); isBytes {
		typ, isString = string(b), true
	}
	if !ok || !isString || typ == "" {
		return wire.ExchangeDeclare{}, wire.NewError(wire.PreconditionFailed,
			"Invalid argument, 'x-delayed-type' must be an existing exchange type")
	}
	if typ == TypeDelayed {
		return wire.ExchangeDeclare{}, wire.NewError(wire.PreconditionFailed,
			fmt.Sprintf("Invalid argument, '%s' can't be used for 'x-delayed-type'", TypeDelayed))
	}
	up := *m
	up.Type = typ
	up.NoWait = false
	return up, nil
}

// registryDef is the registry record of a declared delayed exchange.
func registryDef(vhost string, up *wire.ExchangeDeclare) *store.ExchangeDef {
	return &store.ExchangeDef{
		VHost:       vhost,
		Name:        up.Exchange,
		DelayedType: up.Type,
		Durable:     up.Durable,
		AutoDelete:  up.AutoDelete,
		Internal:    up.Internal,
		Arguments:   append([]byte(nil), up.Arguments...),
	}
}

// inequivalentDelayedType is the 406 for a redeclare whose x-delayed-type
// differs from the registered one, worded as RabbitMQ words any inequivalent
// argument (rabbit_misc:equivalence_fail, both values present).
func inequivalentDelayedType(vhost, name, received, current string) error {
	return wire.NewError(wire.PreconditionFailed, fmt.Sprintf(
		"inequivalent arg '%s' for exchange '%s' in vhost '%s': received '%s' but current is '%s'",
		argDelayedType, name, vhost, received, current))
}

// declare declares the real exchange upstream, then records it.
//
// A redeclare of a registered exchange with another x-delayed-type goes
// upstream with the registered type, so that RabbitMQ judges durable,
// auto-delete, internal and alternate-exchange, in its order, with its own
// texts; only once it has found them equivalent does the proxy refuse the
// x-delayed-type, naming it (the real exchange's type would otherwise make
// RabbitMQ name 'type', an argument the client never sent). Nothing is
// recorded then. An ordinary exchange registered for its delivery-time
// messages (KindDeliveryTime) has no x-delayed-type: RabbitMQ judges the
// declare against the real exchange, and once it accepted it the entry
// becomes a delayed exchange, its pending messages kept.
func (h *connHooks) declare(call *amqpproxy.Call, m *wire.ExchangeDeclare) {
	up, err := realDeclare(m)
	if err != nil {
		closeCall(call, err)
		return
	}
	var inequivalent error
	if cur, ok := h.i.cfg.Store.Exchange(h.c.VHost, m.Exchange); ok && cur.Kind == store.KindDelayed && cur.DelayedType != up.Type {
		inequivalent = inequivalentDelayedType(h.c.VHost, m.Exchange, up.Type, cur.DelayedType)
		up.Type = cur.DelayedType
	}
	done := make(chan struct{})
	h.mu.Lock()
	prev := h.declaring[m.Exchange]
	h.declaring[m.Exchange] = done
	h.mu.Unlock()
	finish := func() {
		h.mu.Lock()
		if h.declaring[m.Exchange] == done {
			delete(h.declaring, m.Exchange)
		}
		h.mu.Unlock()
		close(done)
	}
	def := registryDef(h.c.VHost, &up)
	what := "record delayed exchange " + m.Exchange
	noWait := m.NoWait
	call.Relay(&up, func(r *amqpproxy.Reply) {
		if r.Err != nil || r.Method.ID() != wire.IDExchangeDeclareOk {
			finish()
			if r.Err == nil {
				r.Pass()
			}
			return
		}
		if inequivalent != nil {
			finish()
			code, text := replyOf(inequivalent)
			r.CloseChannel(code, text)
			return
		}
		h.recordThenAnswer(r, noWait, what, func() error {
			defer finish()
			if prev != nil {
				<-prev
			}
			return h.i.cfg.Store.PutExchange(h.i.ctx, def)
		})
	})
}

// recordThenAnswer runs a registry write after RabbitMQ's OK, off the
// upstream reader (it fsyncs), then answers the client: RabbitMQ's reply,
// nothing for a request it sent with no-wait, or 541 when the write failed.
func (h *connHooks) recordThenAnswer(r *amqpproxy.Reply, noWait bool, what string, write func() error) {
	h.i.wg.Go(func() {
		if err := write(); err != nil {
			h.i.cfg.Logger.Error("cannot "+what, "vhost", h.c.VHost, "err", err)
			r.CloseChannel(wire.InternalError, "cannot "+what+": "+err.Error())
			return
		}
		if noWait {
			r.Drop()
		} else {
			r.Pass()
		}
	})
}

// closeCall closes the call's channel with the error's code and text.
func closeCall(call *amqpproxy.Call, err error) {
	code, text := replyOf(err)
	call.CloseChannel(code, text)
}
