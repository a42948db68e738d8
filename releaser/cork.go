package releaser

import (
	"net"
	"sync"
)

// maxCork is the most bytes a corked connection holds back; a write that
// would go past it first sends what is held.
const maxCork = 64 << 10

// corkConn is a net.Conn whose writes can be held back and sent together.
// amqp091-go flushes once per publish (three frames: method, header, body),
// so a batch of n releases would cost n writes, n TCP segments and n
// wake-ups of RabbitMQ's reader; the releaser corks the connection around a
// batch, and the batch goes out in one write.
type corkConn struct {
	net.Conn

	mu     sync.Mutex // guards corked, buf and err; held across writes to Conn, so bytes keep their order
	corked bool
	buf    []byte
	err    error // the first failed write; every later write fails with it
}

// Write sends p, or holds it back while the connection is corked.
func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.corked {
		if len(c.buf)+len(p) > maxCork {
			if err := c.flushLocked(); err != nil {
				return 0, err
			}
		}
		if len(p) <= maxCork {
			c.buf = append(c.buf, p...)
			return len(p), nil
		}
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// cork holds back writes until uncork.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork sends what was held back, in one write. Writes already reported
// success to amqp091-go, so a failure closes the connection: amqp091-go then
// sees it lost and fails the confirms awaited, and the releases are retried.
func (c *corkConn) uncork() {
	c.mu.Lock()
	c.corked = false
	err := c.flushLocked()
	c.mu.Unlock()
	if err != nil {
		c.Conn.Close()
	}
}

func (c *corkConn) flushLocked() error {
	if c.err != nil || len(c.buf) == 0 {
		return c.err
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
	}
	return err
}
