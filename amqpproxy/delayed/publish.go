package delayed

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
)

// job is one delayed publish waiting to be stored.
type job struct {
	msg *store.Message
	pub *amqpproxy.Publish
}

// claim is what InterceptsPublish learnt about a publish it took, carried
// to Publish and on to the store: the registry record of its exchange, or
// the declare in progress on this connection to wait for.
type claim struct {
	def       store.ExchangeDef
	declaring chan struct{} // non-nil: def is looked up once it is closed
	// dt is set for a publish InterceptsContent took: one that asked for a
	// delay with a delivery-time header. def is looked up in Publish.
	dt *deliveryTime
}

// InterceptsPublish implements amqpproxy.ConnHooks: publishes to a delayed
// exchange, or to one this connection is declaring, are taken. It is the
// publish's one registry lookup (but for a publish that waits for a
// declare, which looks the exchange up once the declare is done).
func (h *connHooks) InterceptsPublish(_ *amqpproxy.Channel, m *wire.BasicPublish) (any, bool) {
	if m.Exchange == "" {
		return nil, false
	}
	h.mu.Lock()
	wait := h.declaring[m.Exchange]
	h.mu.Unlock()
	if wait != nil {
		return claim{declaring: wait}, true
	}
	d, ok := h.i.cfg.Store.Exchange(h.c.VHost, m.Exchange)
	if !ok || d.Kind != store.KindDelayed {
		return nil, false // an exchange with delivery-time messages is no delayed exchange
	}
	return claim{def: d}, true
}

// InterceptsContent implements amqpproxy.ConnHooks: a publish to an
// exchange that is not a delayed exchange is taken when its headers ask
// for a delay with x-opt-delivery-time or x-opt-delivery-delay (or for
// more than the maximum delay, to be refused). Only those two headers are
// looked for, without decoding the rest of the table.
func (h *connHooks) InterceptsContent(_ *amqpproxy.Channel, m *wire.BasicPublish, props []byte) (any, bool) {
	if !h.i.cfg.DeliveryTimeHeaders || m.Immediate {
		return nil, false // immediate: RabbitMQ's 540, as for x-delay
	}
	headers, ok := wire.PropertyHeaders(props)
	if !ok {
		return nil, false
	}
	header, v, err := readDeliveryTime(headers)
	if err != nil || header == "" {
		return nil, false // a bad table is RabbitMQ's to judge
	}
	dt, held := deliveryDue(header, v, h.i.cfg.Now(), h.i.cfg.MaxDelay, h.i.cfg.ReleaseWindow)
	if !held {
		return nil, false // past, zero or negative: relayed at once, unchanged
	}
	return claim{dt: &dt}, true
}

// Publish implements amqpproxy.ConnHooks. An x-delay counts from the
// moment the publish reached this host (publishedAt), not from when the
// client reader took it up, and before the waits for a declare in progress
// and for RabbitMQ's permission check (a round trip, and a dial on a
// connection's first delayed publish), which would otherwise make the
// message late by as much.
func (h *connHooks) Publish(p *amqpproxy.Publish) {
	took := publishedAt(h.i.cfg.Now(), p.Received)
	c := p.Claim.(claim)
	if c.dt != nil {
		h.publishDeliveryTime(p, c.dt)
		return
	}
	if c.declaring != nil {
		select {
		case <-c.declaring:
		case <-h.c.Done():
			return
		}
		d, ok := h.i.cfg.Store.Exchange(h.c.VHost, p.Publish.Exchange)
		if !ok {
			p.Relay() // the declare failed: RabbitMQ answers as it would
			return
		}
		c.def = d
	}
	props, err := wire.DecodeProperties(p.Properties())
	if err != nil {
		h.c.Close(wire.SyntaxError, "content header: "+err.Error())
		return
	}
	ms, held, err := parseDelay(props.Headers, h.i.cfg.MaxDelay)
	if err != nil {
		reason := metrics.RefusedInvalidDelay
		if errors.Is(err, errDelayTooLong) {
			reason = metrics.RefusedDelayTooLong
		}
		h.i.cfg.Metrics.Refused(reason)
		closePublish(p, err)
		return
	}
	if !held || p.Publish.Immediate {
		p.Relay() // routed at once, header as it was; immediate: RabbitMQ's 540
		return
	}
	if !h.checkUserID(p, &props) {
		return
	}
	// The proxy releases with its own account: RabbitMQ judges the
	// client's right to publish here, before anything is stored.
	if err := h.checkPublish(&c.def, p.Publish.RoutingKey); err != nil {
		h.refusedUpstream(p, err)
		return
	}
	h.take(p, newMessage(h.c.VHost, p, &props, windowDue(DueAt(took, ms), h.i.cfg.ReleaseWindow), ms, c.def.Incarnation))
}

// newMessage is the stored form of the publish p due at due.
func newMessage(vhost string, p *amqpproxy.Publish, props *wire.Properties, due, delay int64, incarnation uint64) *store.Message {
	return &store.Message{
		VHost:       vhost,
		Exchange:    p.Publish.Exchange,
		RoutingKey:  p.Publish.RoutingKey,
		Mandatory:   p.Publish.Mandatory,
		Properties:  p.Properties(),
		Body:        p.Body,
		Due:         due,
		Delay:       delay,
		Priority:    props.Priority,
		MessageID:   props.MessageID,
		Incarnation: incarnation,
	}
}

// take keeps msg, the stored form of p, with its transaction, or queues it
// for the storer, which answers p once it is durable.
func (h *connHooks) take(p *amqpproxy.Publish, msg *store.Message) {
	if p.Channel.TxMode() {
		h.tx[p.Channel] = append(h.tx[p.Channel], msg)
		p.Ack() // done; tx.commit stores it
		return
	}
	select {
	case h.queue <- &job{msg: msg, pub: p}:
	case <-h.c.Done():
	}
}

// checkUserID refuses p, as RabbitMQ does, when its user_id property is
// not the connection's user.
func (h *connHooks) checkUserID(p *amqpproxy.Publish, props *wire.Properties) bool {
	if props.UserID != "" && props.UserID != h.c.User {
		p.CloseChannel(wire.PreconditionFailed, fmt.Sprintf(
			"user_id property set to '%s' but authenticated user was '%s'", props.UserID, h.c.User))
		return false
	}
	return true
}

// refusedUpstream closes p's channel with RabbitMQ's refusal err of the
// publish permission, and counts it.
func (h *connHooks) refusedUpstream(p *amqpproxy.Publish, err error) {
	reason := metrics.RefusedUpstream
	if code, _ := replyOf(err); code == wire.AccessRefused {
		reason = metrics.RefusedForbidden
	}
	h.i.cfg.Metrics.Refused(reason)
	closePublish(p, err)
}

// checkPublish asks RabbitMQ (Conn.CheckPublish) whether the client's user
// may publish to the delayed exchange def: write permission, and topic
// permission on the routing key when the exchange routes by topic.
func (h *connHooks) checkPublish(def *store.ExchangeDef, routingKey string) error {
	if def.DelayedType != "topic" {
		routingKey = "" // only topic exchanges check the key
	}
	return h.c.CheckPublish(h.i.ctx, def.Name, routingKey)
}

// putsInFlight is how many Puts of one connection's publishes may be in
// flight at once: while one commits, the next takes what queued meanwhile
// and commits beside it, so that a connection's rate is not bounded by one
// commit round trip at a time.
const putsInFlight = 2

// storer stores the connection's delayed publishes in the order they came,
// each Put taking whatever queued up while the Puts in flight committed
// (up to the whole queue), and answers them. It queues each Put itself
// (PutAsync), so a later Put's messages take later sequences and equal due
// times keep publish order; confirms may go out of order between two
// Puts, as RabbitMQ's may between queues.
func (h *connHooks) storer() {
	defer h.i.wg.Done()
	var puts sync.WaitGroup
	defer puts.Wait()
	slots := make(chan struct{}, putsInFlight)
	for j := range h.queue {
		slots <- struct{}{} // what queues while waiting goes into this Put
		// Room in the intake window for what is queued now. When the
		// interceptor is closing, nothing is granted and the Put takes
		// what is queued, to fail on its context and nack.
		limit, err := h.i.cfg.Intake.Acquire(h.i.ctx, 1+len(h.queue))
		granted := err == nil
		if !granted {
			limit = cap(h.queue)
		}
		batch := []*job{j}
	more:
		for len(batch) < min(limit, cap(h.queue)) {
			select {
			case j, ok := <-h.queue:
				if !ok {
					break more
				}
				batch = append(batch, j)
			default:
				break more
			}
		}
		msgs := make([]*store.Message, len(batch))
		for i, j := range batch {
			msgs[i] = j.msg
		}
		if granted && limit > len(batch) {
			h.i.cfg.Intake.Release(limit - len(batch))
		}
		wait := h.i.cfg.Store.PutAsync(h.i.ctx, msgs...)
		puts.Go(func() {
			defer func() {
				if granted {
					h.i.cfg.Intake.Release(len(batch))
				}
				<-slots
			}()
			h.answer(batch, msgs, wait())
		})
	}
}

// answer answers one batch of publishes once its Put returned err: an ack
// each when stored, else a nack (or the channel closed, without confirms).
func (h *connHooks) answer(batch []*job, msgs []*store.Message, err error) {
	if err != nil {
		h.i.cfg.Logger.Error("cannot store delayed messages", "vhost", h.c.VHost, "n", len(msgs), "err", err)
		for _, j := range batch {
			h.i.cfg.Metrics.Refused(metrics.RefusedStoreError)
			if j.pub.Channel.ConfirmMode() {
				j.pub.Nack()
			} else {
				j.pub.CloseChannel(wire.ResourceError, "cannot store delayed message: "+err.Error())
			}
		}
		return
	}
	h.i.cfg.Scheduler.Added(msgs...)
	h.i.cfg.Metrics.Stored(len(msgs))
	for _, j := range batch {
		j.pub.Ack()
	}
}

// commit stores a transaction's delayed publishes, then relays tx.commit;
// if RabbitMQ does not commit, the stored messages are cancelled.
func (h *connHooks) commit(call *amqpproxy.Call, msgs []*store.Message) {
	st := h.i.cfg.Store
	if err := st.PutAsync(h.i.ctx, msgs...)(); err != nil {
		h.i.cfg.Metrics.Refused(metrics.RefusedStoreError)
		h.i.cfg.Logger.Error("cannot store delayed messages at tx.commit", "vhost", h.c.VHost, "n", len(msgs), "err", err)
		call.CloseChannel(wire.ResourceError, "cannot store delayed messages: "+err.Error())
		return
	}
	call.Relay(nil, func(r *amqpproxy.Reply) {
		if r.Err == nil && r.Method.ID() == wire.IDTxCommitOk {
			h.i.cfg.Metrics.Stored(len(msgs))
			h.i.cfg.Scheduler.Added(msgs...)
			r.Pass()
			return
		}
		if r.Err == nil {
			r.Pass()
		}
		h.i.wg.Add(1)
		go func() {
			defer h.i.wg.Done()
			for _, m := range msgs {
				if _, err := st.CancelKey(context.Background(), m.Key); err != nil {
					h.i.cfg.Logger.Error("cannot withdraw delayed message of a failed tx.commit", "key", fmt.Sprintf("%x", m.Key), "err", err)
				}
			}
		}()
	})
}

// closePublish closes the publish's channel with the error's code and text.
func closePublish(p *amqpproxy.Publish, err error) {
	code, text := replyOf(err)
	p.CloseChannel(code, text)
}
