package delayed

import (
	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// exchangeID names a delayed exchange.
type exchangeID struct{ vhost, name string }

// Lookup is the registry's definition of a delayed exchange, unless a client
// is deleting it: from the relay of its exchange.delete until the store has
// removed it, or RabbitMQ refused the delete. It is the releaser's lookup
// for declaring a missing real exchange again, so that a release that meets
// the 404 of an exchange a client is deleting does not bring it back.
func (i *Interceptor) Lookup(vhost, name string) (store.ExchangeDef, bool) {
	i.mu.Lock()
	n := i.deleting[exchangeID{vhost, name}]
	i.mu.Unlock()
	if n > 0 {
		return store.ExchangeDef{}, false
	}
	return i.cfg.Store.Exchange(vhost, name)
}

// markDeleting counts an exchange.delete under way; the func it returns
// ends it.
func (i *Interceptor) markDeleting(id exchangeID) (done func()) {
	i.mu.Lock()
	i.deleting[id]++
	i.mu.Unlock()
	return func() {
		i.mu.Lock()
		if i.deleting[id]--; i.deleting[id] == 0 {
			delete(i.deleting, id)
		}
		i.mu.Unlock()
	}
}

// delete deletes the real exchange upstream, then has the scheduler drop
// the delayed exchange and its pending messages (it counts those).
func (h *connHooks) delete(call *amqpproxy.Call, m *wire.ExchangeDelete) {
	req := *m
	req.NoWait = false
	noWait := m.NoWait
	vhost, name := h.c.VHost, m.Exchange
	done := h.i.markDeleting(exchangeID{vhost, name})
	call.Relay(&req, func(r *amqpproxy.Reply) {
		if r.Err != nil || r.Method.ID() != wire.IDExchangeDeleteOk {
			done()
			if r.Err == nil {
				r.Pass()
			}
			return
		}
		h.recordThenAnswer(r, noWait, "drop delayed exchange "+name, func() error {
			defer done()
			return h.i.cfg.Scheduler.DeleteExchange(h.i.ctx, vhost, name)
		})
	})
}
