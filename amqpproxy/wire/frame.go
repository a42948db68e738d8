package wire

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"
)

// Frame types and limits of AMQP 0-9-1 (spec 4.2.3).
const (
	FrameMethod    = 1
	FrameHeader    = 2
	FrameBody      = 3
	FrameHeartbeat = 8
	FrameEnd       = 0xCE

	// FrameHeaderSize is type (1) + channel (2) + size (4).
	FrameHeaderSize = 7
	// FrameOverhead is the header plus the frame-end octet: a frame of
	// frame_max bytes carries frame_max - FrameOverhead bytes of payload.
	FrameOverhead = FrameHeaderSize + 1
	// FrameMinSize is the smallest frame_max a peer may negotiate.
	FrameMinSize = 4096
)

// ProtocolHeader is what an AMQP 0-9-1 client sends first, and what a server
// answers with before closing when the header it got is wrong.
var ProtocolHeader = [8]byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}

// Frame is one AMQP frame:
//
//	 0      1         3             7                  7+size
//	+------+---------+-------------+------------------+------+
//	| type | channel | size (BE32) | payload          | 0xCE |
//	+------+---------+-------------+------------------+------+
//
// Payload is only valid until the next ReadFrame on the Reader that made it.
type Frame struct {
	Type    uint8
	Channel uint16
	Payload []byte
}

// Reader reads frames, refusing any frame larger than its limit before
// allocating for it.
type Reader struct {
	r        *bufio.Reader
	maxFrame uint32 // whole frame including overhead; 0 means no limit beyond 2^32
	buf      []byte
}

// NewReader returns a Reader that refuses frames larger than maxFrame bytes
// (header and frame-end included).
func NewReader(r io.Reader, maxFrame uint32) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, ReadBufferSize), maxFrame: maxFrame}
}

// ReadBufferSize and WriteBufferSize are the buffer sizes of a Reader and
// a Writer: enough to batch small frames into one system call; larger
// payloads are read and written without a copy through the buffer. Every
// connection holds its read buffers all the time, so they stay small.
const (
	ReadBufferSize  = 16 << 10
	WriteBufferSize = 16 << 10
)

// SetMaxFrame changes the limit, for example once tune-ok has been read.
func (r *Reader) SetMaxFrame(n uint32) { r.maxFrame = n }

// HasFrame reports whether a whole frame is buffered, so that the next
// ReadFrame returns without reading the socket.
func (r *Reader) HasFrame() bool {
	n := r.r.Buffered()
	if n < FrameHeaderSize {
		return false
	}
	hdr, _ := r.r.Peek(FrameHeaderSize)
	return uint64(n) >= uint64(binary.BigEndian.Uint32(hdr[3:7]))+FrameOverhead
}

// Buffered is the bufio.Reader underneath, for the protocol header.
func (r *Reader) Buffered() *bufio.Reader { return r.r }

// ReadFrame reads the next frame. Errors that break the protocol are *Error
// with code FrameError (too large, unknown type, bad frame-end octet, a
// heartbeat with a payload) or UnexpectedFrame (a heartbeat on a channel
// other than 0), as RabbitMQ answers them; I/O errors are returned as they
// are, a frame cut short as io.ErrUnexpectedEOF. Memory grows with the bytes
// that arrive, never with a declared size alone.
func (r *Reader) ReadFrame() (Frame, error) {
	hdr, err := r.r.Peek(FrameHeaderSize)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	f := Frame{Type: hdr[0], Channel: binary.BigEndian.Uint16(hdr[1:3])}
	size := binary.BigEndian.Uint32(hdr[3:7])
	if r.maxFrame != 0 && uint64(size)+FrameOverhead > uint64(r.maxFrame) {
		return Frame{}, NewError(FrameError, fmt.Sprintf("frame size %d exceeds frame_max %d", uint64(size)+FrameOverhead, r.maxFrame))
	}
	switch f.Type {
	case FrameMethod, FrameHeader, FrameBody:
	case FrameHeartbeat:
		// As RabbitMQ: a heartbeat with a payload is malformed (501), one
		// on a channel other than 0 is unexpected (505).
		if size != 0 {
			return Frame{}, NewError(FrameError, fmt.Sprintf("heartbeat frame with a %d-byte payload", size))
		}
		if f.Channel != 0 {
			return Frame{}, NewError(UnexpectedFrame, fmt.Sprintf("heartbeat frame on channel %d", f.Channel))
		}
	default:
		return Frame{}, NewError(FrameError, fmt.Sprintf("unknown frame type %d", f.Type))
	}
	if _, err := r.r.Discard(FrameHeaderSize); err != nil {
		return Frame{}, err
	}
	b, err := r.readPayload(int64(size) + 1)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	if b[size] != FrameEnd {
		return Frame{}, NewError(FrameError, fmt.Sprintf("bad frame end octet 0x%02x", b[size]))
	}
	f.Payload = b[:size]
	return f, nil
}

// eagerRead is how much ReadFrame allocates up front for a payload; a larger
// declared size is read in growing steps, so memory follows the bytes that
// actually arrive, not what a frame header claims.
const eagerRead = 1 << 20

// readPayload reads n bytes into r.buf.
func (r *Reader) readPayload(n int64) ([]byte, error) {
	if n <= int64(cap(r.buf)) || n <= eagerRead {
		if int64(cap(r.buf)) < n {
			r.buf = make([]byte, n)
		}
		b := r.buf[:n]
		_, err := io.ReadFull(r.r, b)
		return b, err
	}
	b := r.buf[:0]
	for int64(len(b)) < n {
		step := min(n-int64(len(b)), max(int64(len(b)), eagerRead))
		b = slices.Grow(b, int(step))
		got, err := io.ReadFull(r.r, b[len(b):len(b)+int(step)])
		b = b[:len(b)+got]
		r.buf = b[:0]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// ReadProtocolHeader reads the 8-byte protocol header a client sends first.
// A wrong header gives ErrBadProtocolHeader; the caller answers with
// ProtocolHeader and closes.
func ReadProtocolHeader(r io.Reader) error {
	var h [8]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	if h != ProtocolHeader {
		return ErrBadProtocolHeader
	}
	return nil
}

// AppendFrame appends f, with its header and frame-end octet, to dst.
func AppendFrame(dst []byte, f Frame) []byte {
	dst = append(dst, f.Type, byte(f.Channel>>8), byte(f.Channel))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(f.Payload)))
	dst = append(dst, f.Payload...)
	return append(dst, FrameEnd)
}

// Writer buffers frames for one connection. It is not safe for concurrent
// use: one writer goroutine owns it. Its buffer comes from a pool shared by
// all Writers when something is written and goes back at Release, so an
// idle connection holds none.
type Writer struct {
	dst io.Writer
	w   *bufio.Writer // nil: released
}

var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, WriteBufferSize) }}

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{dst: w} }

func (w *Writer) buf() *bufio.Writer {
	if w.w == nil {
		w.w = writerPool.Get().(*bufio.Writer)
		w.w.Reset(w.dst)
	}
	return w.w
}

// WriteFrame buffers one frame.
func (w *Writer) WriteFrame(f Frame) error {
	var hdr [FrameHeaderSize]byte
	hdr[0] = f.Type
	binary.BigEndian.PutUint16(hdr[1:3], f.Channel)
	binary.BigEndian.PutUint32(hdr[3:7], uint32(len(f.Payload)))
	b := w.buf()
	if _, err := b.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := b.Write(f.Payload); err != nil {
		return err
	}
	return b.WriteByte(FrameEnd)
}

// Write writes raw bytes (the protocol header).
func (w *Writer) Write(p []byte) (int, error) { return w.buf().Write(p) }

// Buffered is the number of bytes waiting for Flush.
func (w *Writer) Buffered() int {
	if w.w == nil {
		return 0
	}
	return w.w.Buffered()
}

// Release gives the buffer back to the pool if nothing waits in it (after
// a successful Flush); the next write takes one again.
func (w *Writer) Release() {
	if w.w != nil && w.w.Buffered() == 0 {
		w.w.Reset(nil)
		writerPool.Put(w.w)
		w.w = nil
	}
}

// Flush sends what is buffered.
func (w *Writer) Flush() error {
	if w.w == nil {
		return nil
	}
	return w.w.Flush()
}
