package amqpproxy

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// ackFloor follows a channel's consumer deliveries and the client's
// settlements of them (ack, nack, reject), so that a run of the client's
// basic.acks can reach RabbitMQ as one (see foldAck). An ack is foldable
// when it settles the lowest unsettled delivery of its channel: then a
// foldable ack written right behind another on the same channel, with
// multiple set, settles exactly the two of them (and any settled between),
// as the two acks would, with one message to the queue instead of two.
//
// RabbitMQ numbers the deliveries of a channel 1, 2, 3, ..., consumers
// and basic.get alike. ackFloor assumes every delivery needs a
// settlement, so it stops for good on a channel that consumes or gets
// without acks, or is transactional (a rollback unsettles), or recovers
// (redelivers under new tags), or settles out of order further ahead than
// it keeps track of, or settles what it has not relayed (a tag not
// delivered yet, or multiple with tag 0: everything RabbitMQ delivered).
// Stopped, acks are relayed as they are. A settlement of a settled tag is
// never foldable: RabbitMQ refuses it as it would without the proxy.
type ackFloor struct {
	// delivered is the highest delivery tag relayed to the client; the
	// upstream reader stores it before it relays the delivery.
	delivered atomic.Uint64

	// The fields below belong to the client reader.

	// floor is the highest tag up to which every delivery is settled.
	floor uint64
	// ahead marks tags from floor+2 to floor+ackAhead settled out of
	// order: bit t%ackAhead for tag t.
	ahead   [ackAhead / 64]uint64
	stopped bool
}

// ackAhead is how far beyond the lowest unsettled delivery ackFloor keeps
// track of settlements; past it, it stops.
const ackAhead = 1024

// ackPayloadSize is the payload of basic.ack, basic.nack and basic.reject:
// class, method, delivery-tag, one octet of bits.
const ackPayloadSize = 4 + 8 + 1

// delivery records the tag of a basic.deliver or basic.get-ok payload
// relayed to the client; upstream reader only.
//
//	basic.deliver: class method | consumer-tag (shortstr) | delivery-tag (8) | ...
//	basic.get-ok:  class method | delivery-tag (8) | ...
func (a *ackFloor) delivery(id wire.MethodID, payload []byte) {
	at := 4
	if id == wire.IDBasicDeliver {
		if len(payload) < 5 {
			return
		}
		at = 5 + int(payload[4])
	}
	if len(payload) >= at+8 {
		a.delivered.Store(binary.BigEndian.Uint64(payload[at:]))
	}
}

// settle takes a client's basic.ack, basic.nack or basic.reject (id,
// payload) and reports whether it is a foldable ack: one tag, the lowest
// unsettled delivery of the channel.
func (a *ackFloor) settle(id wire.MethodID, payload []byte) bool {
	if a.stopped || len(payload) != ackPayloadSize {
		return false
	}
	tag := binary.BigEndian.Uint64(payload[4:12])
	multiple := id != wire.IDBasicReject && payload[12]&1 != 0
	if tag > a.delivered.Load() || (multiple && tag == 0) {
		// A tag not relayed yet, or every delivery RabbitMQ made, some
		// perhaps not relayed yet: settlements it cannot see.
		a.stop()
		return false
	}
	switch {
	case multiple:
		a.settleTo(tag)
	case tag == a.floor+1:
		a.settleTo(tag)
		return id == wire.IDBasicAck
	case tag > a.floor+1:
		if tag-a.floor > ackAhead {
			a.stop()
			return false
		}
		a.ahead[tag%ackAhead/64] |= aheadBit(tag)
	}
	return false
}

// settleTo marks every tag up to tag settled, then raises the floor past
// the tags settled ahead of it.
func (a *ackFloor) settleTo(tag uint64) {
	switch {
	case tag <= a.floor:
	case tag-a.floor >= ackAhead: // every tag marked ahead is below it
		a.ahead = [ackAhead / 64]uint64{}
		a.floor = tag
	default:
		for a.floor < tag {
			a.floor++
			a.ahead[a.floor%ackAhead/64] &^= aheadBit(a.floor)
		}
	}
	for next := a.floor + 1; a.ahead[next%ackAhead/64]&aheadBit(next) != 0; next++ {
		a.ahead[next%ackAhead/64] &^= aheadBit(next)
		a.floor = next
	}
}

// aheadBit is tag's bit in its word of ahead, a.ahead[tag%ackAhead/64].
func aheadBit(tag uint64) uint64 { return 1 << (tag % 64) }

// method takes a client method that may change how deliveries are
// settled: basic.consume and basic.get (without acks?), basic.recover.
func (a *ackFloor) method(id wire.MethodID, payload []byte) {
	switch id {
	case wire.IDBasicConsume:
		var m wire.BasicConsume
		if m.Decode(payload[4:]) != nil || m.NoAck {
			a.stop()
		}
	case wire.IDBasicGet:
		var m wire.BasicGet
		if m.Decode(payload[4:]) != nil || m.NoAck {
			a.stop()
		}
	case wire.IDBasicRecover, wire.IDBasicRecoverAsync:
		a.stop()
	}
}

func (a *ackFloor) stop() { a.stopped = true }

// foldAck folds foldable ack a into b when b, also foldable, is written
// right after it on the same channel: b gets multiple set and a is not
// written. Upstream writer only.
//
//	basic.ack frame: type channel size | class method | delivery-tag | bits
//	                 0    1       3      7              11             19
func foldAck(a, b *outItem) bool {
	if !a.foldable || !b.foldable || a.ch != b.ch {
		return false
	}
	b.buf[wire.FrameHeaderSize+ackPayloadSize-1] |= 1 // multiple
	return true
}
