package amqpproxy

import (
	"sync/atomic"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// arena hands out frame copies carved from 16 KiB chunks, so relaying a
// small frame costs no allocation of its own. A chunk is freed by the GC
// once every frame in it has been written and the arena moved on. Frames
// larger than a quarter chunk get their own allocation. Only the reader
// that owns the arena carves from it; trim (any goroutine) makes it start a
// new chunk next time, so an idle connection holds none.
type arena struct{ cur atomic.Pointer[arenaBuf] }

// arenaBuf is one chunk; only the owning reader touches buf.
type arenaBuf struct{ buf []byte }

const arenaChunk = 16 << 10

func (a *arena) frame(typ uint8, ch uint16, payload []byte) []byte {
	n := len(payload) + wire.FrameOverhead
	if n > arenaChunk/4 {
		return wire.AppendFrame(make([]byte, 0, n), wire.Frame{Type: typ, Channel: ch, Payload: payload})
	}
	c := a.cur.Load()
	if c == nil || cap(c.buf)-len(c.buf) < n {
		c = &arenaBuf{buf: make([]byte, 0, arenaChunk)}
		a.cur.Store(c)
	}
	start := len(c.buf)
	c.buf = wire.AppendFrame(c.buf, wire.Frame{Type: typ, Channel: ch, Payload: payload})
	return c.buf[start:len(c.buf):len(c.buf)]
}

// trim lets go of the current chunk (the frames carved from it stay valid).
func (a *arena) trim() { a.cur.Store(nil) }
