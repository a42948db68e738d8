package releaser

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// read is the connection's reader goroutine. It owns rd and handles all
// RabbitMQ sends once the connection is open: confirms (basic.ack and
// basic.nack, multiple or not), returned releases and their content, a
// channel or the connection closed by RabbitMQ (answered with close-ok),
// connection.blocked and unblocked, the answers on declareChannel, and
// heartbeats (any bytes count as a sign of life; see Read). It returns when
// the socket ends, after closing it.
func (c *conn) read(rd *wire.Reader) {
	defer func() {
		c.sock.Close()
		close(c.done)
	}()
	var ret returned
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			c.fail(readError(err))
			return
		}
		switch f.Type {
		case wire.FrameHeartbeat:
		case wire.FrameMethod:
			if ret.expecting() {
				c.abort(wire.NewError(wire.UnexpectedFrame, "method frame in the content of basic.return"))
				return
			}
			if stop := c.method(f.Channel, f.Payload, &ret); stop {
				return
			}
		case wire.FrameHeader, wire.FrameBody:
			if err := ret.content(f); err != nil {
				c.abort(err)
				return
			}
		}
	}
}

// readError says why reading from RabbitMQ ended.
func readError(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("RabbitMQ closed the connection: %w", err)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("RabbitMQ did not answer in time: %w", err)
	}
	return err
}

// method handles one method frame; stop says the reader is done.
func (c *conn) method(ch uint16, payload []byte, ret *returned) (stop bool) {
	id, err := wire.PeekMethodID(payload)
	if err != nil {
		c.abort(err)
		return true
	}
	args := payload[4:]
	switch {
	case ch == 0 && id == wire.IDConnectionClose:
		var m wire.ConnectionClose
		if err := m.Decode(args); err != nil {
			c.abort(err)
			return true
		}
		c.send(0, &wire.ConnectionCloseOk{})
		c.fail(serverError(m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID))
		return true
	case ch == 0 && id == wire.IDConnectionCloseOk:
		return true // the answer to close
	case ch == 0 && id == wire.IDConnectionBlocked:
		var m wire.ConnectionBlocked
		m.Decode(args)
		c.log.Warn("RabbitMQ blocked the release connection: releases wait", "vhost", c.vhost, "reason", m.Reason)
	case ch == 0 && id == wire.IDConnectionUnblocked:
		c.log.Info("RabbitMQ unblocked the release connection", "vhost", c.vhost)

	case ch == releaseChannel && id == wire.IDBasicAck:
		var m wire.BasicAck
		if err := m.Decode(args); err != nil {
			c.abort(err)
			return true
		}
		c.confirms.settle(m.DeliveryTag, m.Multiple, acked)
	case ch == releaseChannel && id == wire.IDBasicNack:
		var m wire.BasicNack
		if err := m.Decode(args); err != nil {
			c.abort(err)
			return true
		}
		c.confirms.settle(m.DeliveryTag, m.Multiple, nacked)
	case ch == releaseChannel && id == wire.IDBasicReturn:
		var m wire.BasicReturn
		if err := m.Decode(args); err != nil {
			c.abort(err)
			return true
		}
		// RabbitMQ confirms a returned release after returning it: it
		// leaves the store, counted and logged, never retried.
		c.log.Warn("delayed message unroutable at release",
			"vhost", c.vhost, "exchange", m.Exchange, "routing_key", m.RoutingKey,
			"reply", fmt.Sprintf("%d %s", m.ReplyCode, m.ReplyText))
		if c.metrics != nil {
			c.metrics.Unroutable(1)
		}
		ret.begin()
	case ch == releaseChannel && id == wire.IDChannelClose:
		var m wire.ChannelClose
		if err := m.Decode(args); err != nil {
			c.abort(err)
			return true
		}
		// Publishing is over on this connection: answer, and close it.
		// The reader goes on until close-ok.
		c.send(releaseChannel, &wire.ChannelCloseOk{})
		c.close(serverError(m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID))

	case ch == declareChannel && id == wire.IDChannelClose:
		var m wire.ChannelClose
		if err := m.Decode(args); err != nil {
			c.abort(err)
			return true
		}
		c.send(declareChannel, &wire.ChannelCloseOk{})
		return c.deliver(reply{err: serverError(m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID)})
	case ch == declareChannel:
		return c.deliver(reply{id: id})

	default:
		c.abort(wire.NewError(wire.CommandInvalid, fmt.Sprintf("unexpected %v on channel %d of a release connection", id, ch)))
		return true
	}
	return false
}

// deliver hands an answer on declareChannel to the declare awaiting it.
// One call is outstanding at a time, so an answer nobody awaits is
// RabbitMQ breaking the protocol (or a declare that gave up and ended the
// connection).
func (c *conn) deliver(r reply) (stop bool) {
	select {
	case c.replies <- r:
		return false
	default:
		c.abort(wire.NewError(wire.UnexpectedFrame, fmt.Sprintf("unexpected answer %v on channel %d", r.id, declareChannel)))
		return true
	}
}

// returned follows the content of a basic.return (header, then body frames
// up to its size), which the reader skips.
type returned struct {
	header bool   // a content header is due
	left   uint64 // body bytes still due
}

func (r *returned) begin()          { r.header = true }
func (r *returned) expecting() bool { return r.header || r.left > 0 }

// content takes one header or body frame on the release channel.
func (r *returned) content(f wire.Frame) error {
	switch {
	case f.Channel != releaseChannel:
	case f.Type == wire.FrameHeader && r.header:
		h, err := wire.DecodeContentHeader(f.Payload)
		if err != nil {
			return err
		}
		r.header, r.left = false, h.BodySize
		return nil
	case f.Type == wire.FrameBody && !r.header && uint64(len(f.Payload)) <= r.left && r.left > 0:
		r.left -= uint64(len(f.Payload))
		return nil
	}
	return wire.NewError(wire.UnexpectedFrame, fmt.Sprintf("content frame (type %d) on channel %d with no basic.return before it", f.Type, f.Channel))
}
