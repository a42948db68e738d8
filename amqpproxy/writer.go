package amqpproxy

import (
	"net"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// itemKind says what an outItem carries and how the writer treats it.
type itemKind uint8

const (
	// itemRelay is a frame relayed from the other hop, written as it is.
	itemRelay itemKind = iota
	// itemLifecycle is a channel.close or close-ok (or a connection method)
	// made by the proxy: held back while its channel is in the middle of a
	// content, never dropped.
	itemLifecycle
	// itemReply is a method the proxy sends in answer to a client request:
	// held back while its channel is mid-content, dropped once the channel
	// is closed on this hop.
	itemReply
	// itemConfirm is an upstream basic.ack or basic.nack (tag, multiple)
	// to translate into client tags; client-bound writer only.
	itemConfirm
	// itemLocalConfirm is the ack or nack of one client tag answered by the
	// proxy itself; client-bound writer only.
	itemLocalConfirm
)

// outItem is one unit of a writer's queue.
type outItem struct {
	buf      []byte   // an encoded frame (header, payload, frame-end); nil for confirms
	ch       *Channel // the channel the frame is on; nil for channel 0 and unknown channels
	tag      uint64   // confirms: the delivery tag
	kind     itemKind
	multiple bool // itemConfirm
	nack     bool // itemConfirm, itemLocalConfirm
	// foldable: itemRelay, a client's basic.ack of the lowest unsettled
	// delivery on its channel (see ackFloor); upstream writer only.
	foldable bool
}

// size is what an item counts against its queue's limit: its frame, or
// the frames a confirm becomes.
func (it *outItem) size() int {
	if it.buf == nil {
		return 32
	}
	return len(it.buf)
}

// outQueue is a writer's bounded queue. Relayed frames wait for room
// (back-pressure: the reader that relays them stops reading its socket);
// frames the proxy makes itself never wait, so goroutines outside the
// session (an interceptor's store) are never blocked by a slow peer.
//
// The reader that relays into the queue adds its frames quietly
// (pushQuiet) and wakes the writer (wake) once per socket read, so the
// frames of one read leave in one write; every other push wakes it at
// once.
type outQueue struct {
	mu     sync.Mutex // guards items, bytes, closed, quiet
	items  []outItem
	bytes  int
	limit  int
	closed bool
	// quiet: items were added without waking the writer since it last
	// took the queue.
	quiet   bool
	notFull sync.Cond     // on mu: bytes fell below limit, or closed
	ready   chan struct{} // capacity 1: items were added, or closed
}

func newOutQueue(limit int) *outQueue {
	q := &outQueue{limit: limit, ready: make(chan struct{}, 1)}
	q.notFull.L = &q.mu
	return q
}

func (q *outQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// push appends it and wakes the writer, waiting while the queue holds
// limit bytes or more. It reports false when the queue is closed.
func (q *outQueue) push(it outItem) bool { return q.pushWhenRoom(it, true) }

// pushQuiet is push without waking the writer, for the reader that relays
// into the queue: it calls wake once it has no whole frame left to read
// and before it calls out of the session (a hook), which may wait for
// what it queued. Waiting for room wakes the writer first.
func (q *outQueue) pushQuiet(it outItem) bool { return q.pushWhenRoom(it, false) }

func (q *outQueue) pushWhenRoom(it outItem, wake bool) bool {
	q.mu.Lock()
	for q.bytes >= q.limit && !q.closed {
		q.wakeLocked()
		q.notFull.Wait()
	}
	ok := q.add(it, wake)
	q.mu.Unlock()
	return ok
}

// pushNow appends it without waiting for room, and wakes the writer.
func (q *outQueue) pushNow(it outItem) bool {
	q.mu.Lock()
	ok := q.add(it, true)
	q.mu.Unlock()
	return ok
}

func (q *outQueue) add(it outItem, wake bool) bool {
	if q.closed {
		return false
	}
	q.items = append(q.items, it)
	q.bytes += it.size()
	switch {
	case !wake:
		q.quiet = true
	case len(q.items) == 1 || q.quiet:
		q.quiet = false
		q.signal()
	}
	return true
}

// wake wakes the writer for what was pushed quietly.
func (q *outQueue) wake() {
	q.mu.Lock()
	q.wakeLocked()
	q.mu.Unlock()
}

func (q *outQueue) wakeLocked() {
	if q.quiet {
		q.quiet = false
		q.signal()
	}
}

// take moves every queued item to dst (which it returns) and reports
// whether the queue is closed.
func (q *outQueue) take(dst []outItem) ([]outItem, bool) {
	q.mu.Lock()
	dst = append(dst, q.items...)
	clear(q.items)
	q.items = q.items[:0]
	q.quiet = false
	if q.bytes >= q.limit {
		q.notFull.Broadcast()
	}
	q.bytes = 0
	closed := q.closed
	q.mu.Unlock()
	return dst, closed
}

// close makes push and pushNow fail from now on; the writer writes what is
// already queued and exits.
func (q *outQueue) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		q.notFull.Broadcast()
		q.signal()
	}
	q.mu.Unlock()
}

// outState is a writer's view of one channel: whether a content (header and
// body frames) is in progress on its output, the proxy's frames held back
// until it ends, and whether the channel has been closed on this hop.
// Only the writer goroutine of that hop touches it.
type outState struct {
	inContent bool
	remaining uint64 // body bytes still to come; valid after the header
	gotHeader bool
	closed    bool
	held      []outItem
}

// writer owns one socket's write side: one goroutine drains the queue into a
// wire.Writer and flushes when the queue is empty, so frames that arrive
// together leave in one write without a timer.
type writer struct {
	conn     net.Conn
	w        *wire.Writer
	q        *outQueue
	toClient bool          // client-bound: translates confirms, closes channels
	beat     time.Duration // send a heartbeat after this long without writing; 0: never
	fail     func(error)   // called once on a write error
	metrics  Metrics       // nil: none; relayed frames are counted per flush
	arena    *arena        // the other hop's reader's arena, trimmed when idle; nil: none
	// keepOpen, when set, is asked once the queue was closed and all of it
	// written: true leaves the socket open (its reader closes it later).
	keepOpen func() bool

	frames, bytes int // relayed since the last flush
	folded        int // acks folded since the last flush

	wrote bool     // something was written since the last heartbeat tick
	tags  []uint64 // scratch for confirm translation
	buf   []byte   // scratch for frames the writer encodes
	ack   wire.BasicAck
	nack  wire.BasicNack
}

var heartbeatFrame = []byte{wire.FrameHeartbeat, 0, 0, 0, 0, 0, 0, wire.FrameEnd}

// run is the writer goroutine. It returns after the queue was closed and
// drained, or after a write error; either way it closes the socket, which
// ends the reader of the same socket, unless keepOpen says otherwise after
// a clean end.
func (w *writer) run() {
	clean := false
	defer func() {
		if !clean || w.keepOpen == nil || !w.keepOpen() {
			w.conn.Close()
		}
	}()
	var tick <-chan time.Time
	if w.beat > 0 {
		t := time.NewTicker(w.beat)
		defer t.Stop()
		tick = t.C
	}
	var batch []outItem
	for {
		select {
		case <-w.q.ready:
		case <-tick:
			if !w.wrote {
				// Idle for a while: the frames carved from the arena
				// are written; let its chunk go.
				if w.arena != nil {
					w.arena.trim()
				}
				if _, err := w.w.Write(heartbeatFrame); err != nil {
					w.failed(err)
					return
				}
				if err := w.w.Flush(); err != nil {
					w.failed(err)
					return
				}
				w.w.Release()
			}
			w.wrote = false
			continue
		}
		for {
			var closed bool
			batch, closed = w.q.take(batch[:0])
			for i := range batch {
				if i+1 < len(batch) && foldAck(&batch[i], &batch[i+1]) {
					w.folded++
					batch[i] = outItem{}
					continue
				}
				if err := w.write(&batch[i]); err != nil {
					w.failed(err)
					return
				}
				batch[i] = outItem{}
			}
			if len(batch) > 0 {
				w.wrote = true
				continue
			}
			if err := w.w.Flush(); err != nil {
				w.failed(err)
				return
			}
			w.w.Release() // an idle connection holds no write buffer
			// A fold writes its last ack, so folded > 0 only with frames.
			if w.frames > 0 && w.metrics != nil {
				w.metrics.Relayed(!w.toClient, w.frames, w.bytes)
				if w.folded > 0 {
					w.metrics.AcksFolded(w.folded)
				}
				w.frames, w.bytes, w.folded = 0, 0, 0
			}
			if closed {
				clean = true
				return
			}
			break
		}
	}
}

func (w *writer) failed(err error) {
	w.q.close()
	w.fail(err)
}

// state returns the writer's view of ch on this hop.
func (w *writer) state(ch *Channel) *outState {
	if w.toClient {
		return &ch.toClient
	}
	return &ch.toUpstream
}

// write writes one item, holding back the proxy's own frames while their
// channel is mid-content on this hop.
func (w *writer) write(it *outItem) error {
	if it.kind == itemRelay {
		w.frames++
		w.bytes += len(it.buf)
	}
	if it.ch == nil {
		return w.frame(it.buf)
	}
	st := w.state(it.ch)
	if it.kind == itemRelay {
		if err := w.frame(it.buf); err != nil {
			return err
		}
		if w.track(st, it.buf) && len(st.held) > 0 {
			held := st.held
			st.held = nil
			for i := range held {
				if err := w.write(&held[i]); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if st.inContent {
		st.held = append(st.held, *it)
		return nil
	}
	switch it.kind {
	case itemLifecycle:
		if err := w.frame(it.buf); err != nil {
			return err
		}
		w.track(st, it.buf)
		return nil
	case itemReply:
		if st.closed {
			return nil
		}
		return w.frame(it.buf)
	case itemConfirm, itemLocalConfirm:
		if st.closed {
			return nil
		}
		return w.confirm(it)
	}
	return nil
}

// track follows contents and channel closes in the frames written on ch.
// It reports whether a content just ended.
func (w *writer) track(st *outState, frame []byte) bool {
	payload := frame[wire.FrameHeaderSize : len(frame)-1]
	switch frame[0] {
	case wire.FrameMethod:
		id, err := wire.PeekMethodID(payload)
		if err != nil {
			return false
		}
		ended := st.inContent // a method cuts a broken content short
		st.inContent, st.gotHeader = false, false
		switch {
		case wire.HasContent(id):
			st.inContent = true
		case id == wire.IDChannelClose || id == wire.IDChannelCloseOk:
			st.closed = true
		}
		return ended
	case wire.FrameHeader:
		if !st.inContent || st.gotHeader {
			return false
		}
		size, ok := bodySize(payload)
		if !ok || size == 0 {
			st.inContent = false
			return true
		}
		st.gotHeader, st.remaining = true, size
	case wire.FrameBody:
		if !st.inContent || !st.gotHeader {
			return false
		}
		if uint64(len(payload)) >= st.remaining {
			st.inContent, st.gotHeader = false, false
			return true
		}
		st.remaining -= uint64(len(payload))
	}
	return false
}

// confirm translates an upstream confirm, or sends a local one, on the
// client-bound hop.
func (w *writer) confirm(it *outItem) error {
	ch := it.ch
	ch.mu.Lock()
	cm := ch.confirms
	if cm == nil {
		ch.mu.Unlock()
		if it.kind == itemConfirm { // not a channel we saw confirm.select on: relay
			return w.frame(w.confirmFrame(ch.id, it.tag, it.multiple, it.nack))
		}
		return nil
	}
	w.tags = w.tags[:0]
	if it.kind == itemConfirm {
		w.tags = cm.fromUpstream(w.tags, it.tag, it.multiple)
	} else {
		w.tags = append(w.tags, it.tag)
	}
	var err error
	cm.mark(w.tags, func(tag uint64, multiple bool) {
		if err == nil {
			err = w.frame(w.confirmFrame(ch.id, tag, multiple, it.nack))
		}
	})
	ch.mu.Unlock()
	ch.s.poke()
	return err
}

// confirmFrame encodes a basic.ack or basic.nack (requeue=false) into the
// writer's scratch buffer.
func (w *writer) confirmFrame(ch uint16, tag uint64, multiple, nack bool) []byte {
	if nack {
		w.nack = wire.BasicNack{DeliveryTag: tag, Multiple: multiple}
		w.buf = methodFrame(w.buf[:0], ch, &w.nack)
	} else {
		w.ack = wire.BasicAck{DeliveryTag: tag, Multiple: multiple}
		w.buf = methodFrame(w.buf[:0], ch, &w.ack)
	}
	return w.buf
}

func (w *writer) frame(b []byte) error {
	_, err := w.w.Write(b)
	return err
}

// bodySize reads the body size of a content header payload; false when
// the header is malformed.
func bodySize(payload []byte) (uint64, bool) {
	h, err := wire.DecodeContentHeader(payload)
	return h.BodySize, err == nil
}
