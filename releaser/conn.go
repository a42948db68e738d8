package releaser

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// The channels of a release connection.
const (
	releaseChannel = 1 // confirm mode: every release is published here
	declareChannel = 2 // opened for a declare, closed after it
)

// closeTimeout bounds a polite close: connection.close, then close-ok.
const closeTimeout = time.Second

// conn is one connection to RabbitMQ for the releases of one vhost. Its
// reader goroutine owns the read side (see read); writes are serialised by
// wmu; its heartbeat goroutine sends heartbeats and watches for a silent
// peer. It ends once (fail): the first reason is kept, every confirm
// awaited fails, dead is closed, and the socket closes soon after.
type conn struct {
	vhost string
	sock  net.Conn
	log   *slog.Logger
	// metrics and delayType are the Releaser's.
	metrics   Metrics
	delayType DelayType
	// Negotiated with RabbitMQ at dial; fixed after.
	frameMax  int
	heartbeat time.Duration // 0: none

	// wmu guards the socket's write side, enc, ctl and nextTag. A batch is
	// encoded, its delivery tags registered and its bytes written under it,
	// so delivery tags follow the order of the bytes.
	wmu     sync.Mutex
	enc     encoder
	ctl     []byte // scratch for control frames
	nextTag uint64 // delivery tag of the last release written

	confirms confirms

	// declareMu serialises declares: one synchronous call at a time on
	// declareChannel, whose answers the reader hands over on replies.
	declareMu sync.Mutex
	replies   chan reply

	born      time.Time    // origin of lastRead and lastWrite (monotonic)
	lastRead  atomic.Int64 // ns after born that bytes last arrived
	lastWrite atomic.Int64 // ns after born that bytes last left

	failOnce  sync.Once
	err       error // why the connection ended; written before dead is closed
	lost      bool  // confirms were awaited when it ended; written before dead is closed
	dead      chan struct{}
	closeOnce sync.Once
	done      chan struct{} // closed when the reader has returned and closed the socket
}

// reply is the answer to a method sent on declareChannel: its method id,
// or the error RabbitMQ closed the channel (or the connection) with.
type reply struct {
	id  wire.MethodID
	err error
}

// publish encodes the releases batch[i], i in idx, writes them in one
// piece and returns what awaits their confirms (nil when none was
// written). A message that can never be released (a corrupt record) is
// logged, written nowhere and reported confirmed, so that it leaves the
// store. An error means the connection ended: the releases are unconfirmed.
func (c *conn) publish(batch []*store.Message, idx []int, confirmed []bool) (*pending, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer c.enc.reset() // and let go of the bodies
	sent := make([]int, 0, len(idx))
	for _, i := range idx {
		m := batch[i]
		if err := c.enc.add(m, c.frameMax, c.delayType); err != nil {
			c.log.Error("discarding stored message that cannot be released",
				"vhost", m.VHost, "exchange", m.Exchange, "key", fmt.Sprintf("%x", m.Key), "err", err)
			confirmed[i] = true
			continue
		}
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return nil, nil
	}
	p, ok := c.confirms.add(c.nextTag+1, sent)
	if !ok {
		return nil, fmt.Errorf("release connection ended: %w", c.err)
	}
	c.nextTag += uint64(len(sent))
	if err := c.enc.writeTo(c.sock); err != nil {
		c.abort(fmt.Errorf("write to RabbitMQ: %w", err))
		return p, err
	}
	c.wrote()
	return p, nil
}

// send writes one method frame.
func (c *conn) send(ch uint16, m wire.Method) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.ctl = wire.AppendFrame(c.ctl[:0], wire.Frame{Type: wire.FrameMethod, Channel: ch, Payload: wire.AppendMethod(nil, m)})
	if _, err := c.sock.Write(c.ctl); err != nil {
		return err
	}
	c.wrote()
	return nil
}

func (c *conn) wrote() { c.lastWrite.Store(int64(time.Since(c.born))) }

// Read implements io.Reader for the wire.Reader: it notes when bytes
// arrive, which is what proves RabbitMQ alive.
func (c *conn) Read(p []byte) (int, error) {
	n, err := c.sock.Read(p)
	if n > 0 {
		c.lastRead.Store(int64(time.Since(c.born)))
	}
	return n, err
}

// fail ends the connection for err, once: the first reason wins. Every
// path that calls it closes the socket soon after (abort, close, or the
// reader returning).
func (c *conn) fail(err error) {
	c.failOnce.Do(func() {
		c.err = err
		c.lost = c.confirms.end()
		close(c.dead)
		if !errors.Is(err, ErrClosed) {
			c.log.Warn("release connection lost", "vhost", c.vhost, "err", err)
		}
	})
}

// abort ends the connection for err at once, without a word to RabbitMQ.
func (c *conn) abort(err error) {
	c.fail(err)
	c.sock.Close()
}

// close ends the connection for err and closes it politely:
// connection.close, and the reader returns at close-ok or after
// closeTimeout, whichever comes first.
func (c *conn) close(err error) {
	c.fail(err)
	c.closeOnce.Do(func() {
		// The deadline also frees a write blocked on a full socket, so
		// that the lock is had.
		c.sock.SetDeadline(time.Now().Add(closeTimeout))
		c.send(0, &wire.ConnectionClose{ReplyCode: wire.ReplySuccess, ReplyText: "Goodbye"})
	})
}

// beat sends a heartbeat when nothing was written for half the interval,
// so RabbitMQ hears from us at least once an interval, and ends the
// connection once nothing arrived for two intervals: RabbitMQ sends its
// heartbeats at the same interval, so it is gone or the link is. It wakes
// every half interval and at the moment the silence would reach two, so a
// silent peer is found two intervals after its last byte. It returns when
// the reader does.
func (c *conn) beat() {
	t := time.NewTimer(c.heartbeat / 2)
	defer t.Stop()
	heartbeat := wire.AppendFrame(nil, wire.Frame{Type: wire.FrameHeartbeat})
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		now := time.Since(c.born)
		silent := now - time.Duration(c.lastRead.Load())
		if silent >= 2*c.heartbeat {
			c.abort(fmt.Errorf("nothing from RabbitMQ for %v (heartbeat %v)", silent.Round(time.Millisecond), c.heartbeat))
			continue // the timer is spent: wait for the reader to return
		}
		t.Reset(min(c.heartbeat/2, 2*c.heartbeat-silent))
		if now-time.Duration(c.lastWrite.Load()) < c.heartbeat/2 || !c.wmu.TryLock() {
			continue // bytes left lately, or a batch is being written
		}
		// A heartbeat that cannot leave within the interval finds the
		// socket full and the peer not reading: gone.
		c.sock.SetWriteDeadline(time.Now().Add(c.heartbeat))
		_, err := c.sock.Write(heartbeat)
		c.sock.SetWriteDeadline(time.Time{})
		c.wmu.Unlock()
		if err != nil {
			c.abort(fmt.Errorf("heartbeat to RabbitMQ: %w", err))
			continue
		}
		c.wrote()
	}
}

// serverError is the error RabbitMQ closed a channel or the connection
// with, reply code and text as it sent them ("NOT_FOUND - no exchange 'x'
// in vhost '/'" gives Code 404, Text "no exchange 'x' in vhost '/'").
func serverError(code uint16, text string, class, method uint16) *wire.Error {
	return &wire.Error{Code: code, Text: strings.TrimPrefix(text, wire.ReplyText(code)+" - "), ClassID: class, MethodID: method}
}
