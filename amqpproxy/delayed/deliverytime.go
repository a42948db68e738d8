package delayed

import (
	"bytes"
	"fmt"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
)

// The delivery-time headers of RabbitMQ 4.4's quorum queues and Tanzu's
// delayed queues, honoured on any exchange that is not a delayed exchange.
const (
	// headerDeliveryTime is an absolute due time, unix milliseconds.
	headerDeliveryTime = "x-opt-delivery-time"
	// headerDeliveryDelay is a delay, milliseconds.
	headerDeliveryDelay = "x-opt-delivery-delay"
)

// deliveryHeaders are the names Table.Find looks for, in one pass.
var deliveryHeaders = []string{headerDeliveryTime, headerDeliveryDelay}

// deliveryPrefix is in both names: a table whose bytes do not hold it has
// neither, and is not parsed at all.
var deliveryPrefix = []byte("x-opt-delivery-")

// deliveryTime is what InterceptsContent learnt of a publish that asked for
// a delay with a delivery-time header: its due time, or the 406 that
// refuses it.
type deliveryTime struct {
	due int64 // unix ms, release window applied
	err error
}

// readDeliveryTime reads the delivery-time headers of a headers table the
// way the RabbitMQ 4.4 API reads them: a value is an integer of any width,
// signed or unsigned, or for x-opt-delivery-time also a timestamp ('T',
// seconds, taken as seconds*1000, as RabbitMQ converts it). A value of any
// other type (a string, a float, a decimal, a boolean, ...) is not read: the
// header is as good as absent. When both headers are readable,
// x-opt-delivery-time decides and x-opt-delivery-delay rides along.
//
// It returns which header decided ("" for none) and its value: the time
// in unix ms, or the delay in ms. A table that does not parse gives an
// error; the caller relays the publish and RabbitMQ judges it. A table
// that does not hold the bytes "x-opt-delivery-" is not parsed.
func readDeliveryTime(headers wire.Table) (header string, v int64, err error) {
	if !bytes.Contains(headers, deliveryPrefix) {
		return "", 0, nil // neither name is in the table: nothing to parse
	}
	var vals [2]int64
	var ok [2]bool
	err = headers.Find(deliveryHeaders, func(i int, val any) {
		vals[i], ok[i] = deliveryValue(val, i == 0)
	})
	switch {
	case err != nil:
		return "", 0, err
	case ok[0]:
		return headerDeliveryTime, vals[0], nil
	case ok[1]:
		return headerDeliveryDelay, vals[1], nil
	}
	return "", 0, nil
}

// deliveryValue converts one header value; ok is false for a type that is
// not read. A timestamp counts only as a time (isTime).
func deliveryValue(v any, isTime bool) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case int16:
		return int64(v), true
	case uint16:
		return int64(v), true
	case int32:
		return int64(v), true
	case uint32:
		return int64(v), true
	case int64:
		return v, true
	case time.Time:
		return v.UnixMilli(), isTime
	}
	return 0, false
}

// deliveryDue is the due time of a publish whose header (as
// readDeliveryTime returned it) holds v, published at now: held is false
// for a time that is not in the future and for a delay that is not
// positive (relayed at once, unchanged). A time or delay more than max
// (when max > 0) ahead is a 406 naming the header. The due time is never
// before the time asked for, rounded up to the release window.
func deliveryDue(header string, v int64, now time.Time, max, window time.Duration) (d deliveryTime, held bool) {
	nowMs := DueAt(now, 0)
	var due, ahead int64
	switch header {
	case headerDeliveryTime:
		if v <= nowMs {
			return d, false
		}
		due, ahead = v, v-nowMs
	case headerDeliveryDelay:
		if v <= 0 {
			return d, false
		}
		due, ahead = DueAt(now, v), v
	default:
		return d, false
	}
	if max > 0 && ahead > max.Milliseconds() {
		d.err = newDelayError(errDelayTooLong, fmt.Sprintf("%s %d is %d ms ahead, more than the maximum delay %d ms",
			header, v, ahead, max.Milliseconds()))
		return d, true
	}
	d.due = windowDue(due, window)
	return d, true
}

// publishDeliveryTime takes a publish InterceptsContent chose. One that
// asks for more than the maximum delay is refused with 406. Otherwise,
// once RabbitMQ allowed the client to publish to the exchange (and the
// routing key, for a topic exchange), it is stored under the exchange's
// registry entry (registered by its first such publish) like a delayed
// message, with Delay 0: it is released with its properties unchanged.
func (h *connHooks) publishDeliveryTime(p *amqpproxy.Publish, dt *deliveryTime) {
	if dt.err != nil {
		h.i.cfg.Metrics.Refused(metrics.RefusedDelayTooLong)
		closePublish(p, dt.err)
		return
	}
	props, err := wire.DecodeProperties(p.Properties())
	if err != nil {
		h.c.Close(wire.SyntaxError, "content header: "+err.Error())
		return
	}
	if !h.checkUserID(p, &props) {
		return
	}
	if err := h.c.CheckPublish(h.i.ctx, p.Publish.Exchange, p.Publish.RoutingKey); err != nil {
		h.refusedUpstream(p, err)
		return
	}
	def, ok := h.i.cfg.Store.Exchange(h.c.VHost, p.Publish.Exchange)
	if !ok {
		def = store.ExchangeDef{VHost: h.c.VHost, Name: p.Publish.Exchange, Kind: store.KindDeliveryTime}
		if err := h.i.cfg.Store.PutExchange(h.i.ctx, &def); err != nil {
			h.i.cfg.Logger.Error("cannot register exchange for delivery-time messages", "vhost", h.c.VHost, "exchange", def.Name, "err", err)
			h.i.cfg.Metrics.Refused(metrics.RefusedStoreError)
			if p.Channel.ConfirmMode() {
				p.Nack()
			} else {
				p.CloseChannel(wire.ResourceError, "cannot store delayed message: "+err.Error())
			}
			return
		}
	}
	if def.Kind == store.KindDelayed {
		// Declared a delayed exchange since InterceptsPublish passed it
		// by: x-delay decides, as for any publish to one.
		p.Claim = claim{def: def}
		h.Publish(p)
		return
	}
	h.take(p, newMessage(h.c.VHost, p, &props, dt.due, 0, def.Incarnation))
}
