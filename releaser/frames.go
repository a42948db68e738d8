package releaser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// headerDelay is the header the client set the delay in, and the release
// sets to minus the delay.
const headerDelay = "x-delay"

// classBasic is the content class of basic.publish.
var classBasic = wire.IDBasicPublish.Class()

// inlineBody is the largest body copied into a batch's buffer; a larger one
// is written from the message itself (writev on TCP), so a big message is
// not copied and its copy not kept.
const inlineBody = 8 << 10

// keepBuffer is the most buffer capacity a connection keeps between
// batches; a larger buffer, grown by one big batch, is let go.
const keepBuffer = 1 << 20

// errHeaderTooLarge: the content header does not fit RabbitMQ's frame_max.
// A content header cannot be split across frames.
var errHeaderTooLarge = errors.New("content header larger than frame_max")

// encoder lays out one batch of releases as AMQP frames on channel 1:
// basic.publish, its content header, its body frames, release after
// release. It is reused from batch to batch (see conn.wmu).
type encoder struct {
	buf   []byte      // the batch's bytes, except bodies over inlineBody
	parts []part      // the bodies written from their messages, in order
	iov   net.Buffers // scratch of writeTo
	props []byte      // scratch: one release's properties
	field [9]byte     // scratch: one release's x-delay value
}

// part is a body chunk written from its message: it goes after buf[:end]
// (and after the parts before it) and before buf[end:].
type part struct {
	end  int
	body []byte
}

// reset empties e for the next batch.
func (e *encoder) reset() {
	clear(e.parts) // let go of the messages' bodies
	e.parts = e.parts[:0]
	if cap(e.buf) > keepBuffer {
		e.buf = nil
	}
	e.buf = e.buf[:0]
}

// add appends the frames of one release of m: its routing, its properties
// byte for byte except x-delay, set to -Delay as delayType says (unless
// Delay is 0: a delivery-time message keeps every byte), and its
// body in frames of at most frameMax bytes. It appends nothing when m
// cannot be released (a corrupt record, or a header over frameMax).
func (e *encoder) add(m *store.Message, frameMax int, delayType DelayType) error {
	if len(m.Exchange) > math.MaxUint8 || len(m.RoutingKey) > math.MaxUint8 {
		return fmt.Errorf("exchange or routing key longer than 255 bytes")
	}
	props := m.Properties // a delivery-time message (Delay 0): the client's bytes
	if m.Delay != 0 {
		var err error
		e.props, err = wire.AppendWithHeader(e.props[:0], m.Properties, headerDelay, e.delayField(m.Delay, delayType))
		if err != nil {
			return err
		}
		props = e.props
	}
	if headerSize := 12 + len(props); headerSize > frameMax-wire.FrameOverhead {
		return fmt.Errorf("%w: %d bytes, frame_max %d", errHeaderTooLarge, headerSize+wire.FrameOverhead, frameMax)
	}

	at := len(e.buf)
	e.buf = append(e.buf, wire.FrameMethod, 0, releaseChannel, 0, 0, 0, 0)
	e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(wire.IDBasicPublish))
	publish := wire.BasicPublish{Exchange: m.Exchange, RoutingKey: m.RoutingKey, Mandatory: true}
	e.buf = publish.Append(e.buf)
	e.buf = endFrame(e.buf, at)

	at = len(e.buf)
	e.buf = append(e.buf, wire.FrameHeader, 0, releaseChannel, 0, 0, 0, 0)
	e.buf = wire.AppendContentHeader(e.buf, wire.ContentHeader{ClassID: classBasic, BodySize: uint64(len(m.Body)), Properties: props})
	e.buf = endFrame(e.buf, at)

	inline := len(m.Body) <= inlineBody
	for b := m.Body; len(b) > 0; {
		chunk := b[:min(len(b), frameMax-wire.FrameOverhead)]
		b = b[len(chunk):]
		e.buf = append(e.buf, wire.FrameBody, 0, releaseChannel)
		e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(len(chunk)))
		if inline {
			e.buf = append(e.buf, chunk...)
		} else {
			e.parts = append(e.parts, part{end: len(e.buf), body: chunk})
		}
		e.buf = append(e.buf, wire.FrameEnd)
	}
	return nil
}

// delayField is the released x-delay value, -delay: 'I' for DelayInt32
// when it fits a signed 32-bit integer, 'l' otherwise.
func (e *encoder) delayField(delay int64, t DelayType) []byte {
	v := -delay
	if t == DelayInt32 && v >= math.MinInt32 && v <= math.MaxInt32 {
		e.field[0] = 'I'
		binary.BigEndian.PutUint32(e.field[1:], uint32(int32(v)))
		return e.field[:5]
	}
	e.field[0] = 'l'
	binary.BigEndian.PutUint64(e.field[1:], uint64(v))
	return e.field[:9]
}

// endFrame writes the size of the frame that starts at buf[at] and appends
// its frame-end octet.
func endFrame(buf []byte, at int) []byte {
	binary.BigEndian.PutUint32(buf[at+3:], uint32(len(buf)-at-wire.FrameHeaderSize))
	return append(buf, wire.FrameEnd)
}

// writeTo writes the batch to w: one write, or one writev on TCP when
// bodies are written from their messages.
func (e *encoder) writeTo(w io.Writer) error {
	if len(e.parts) == 0 {
		_, err := w.Write(e.buf)
		return err
	}
	iov := e.iov[:0]
	prev := 0
	for _, p := range e.parts {
		if p.end > prev {
			iov = append(iov, e.buf[prev:p.end])
		}
		iov = append(iov, p.body)
		prev = p.end
	}
	iov = append(iov, e.buf[prev:])
	e.iov = iov
	_, err := iov.WriteTo(w)
	return err
}
