package releaser

import (
	"errors"
	"time"
)

// Backoff of redial: the first attempt is at once, then each wait doubles
// up to the last. After a connection that ended younger than
// redialYoung, the first attempt waits too, so that a RabbitMQ that closes
// every new connection is not dialled in a tight loop.
const (
	redialFirstWait = 100 * time.Millisecond
	redialMaxWait   = 30 * time.Second
	redialYoung     = time.Second
)

// ended is called by c's reader once c has ended. When c ended with
// nothing in flight (RabbitMQ closed it, restarted, or the link dropped
// while it was idle), it dials the vhost's connection again in the
// background, so that the next release does not wait for a dial. A
// connection that ended with releases in flight is left to the release
// path, which refuses the vhost's next batches until the failed one is
// retried (conn), and a connection closed by Close is not dialled again.
func (r *Releaser) ended(c *conn) {
	select {
	case <-c.dead: // err and lost are written before dead is closed
	default:
		return
	}
	if c.lost || errors.Is(c.err, ErrClosed) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.conns[c.vhost] != c {
		return // closing, or the vhost has another connection already
	}
	first := time.Duration(0)
	if time.Since(c.born) < redialYoung {
		first = redialFirstWait
	}
	r.wg.Go(func() { r.redial(c.vhost, first) })
}

// redial dials vhost's connection, after first, until it has one, backing
// off between failed attempts, and returns at once when the Releaser
// closes. conn does the dialling, so a connection a release dialled
// meanwhile ends it too.
func (r *Releaser) redial(vhost string, first time.Duration) {
	wait := first
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-r.stop.Done():
				t.Stop()
				return
			}
		}
		_, err := r.conn(r.stop, vhost)
		if err == nil || errors.Is(err, ErrClosed) || r.stop.Err() != nil {
			return
		}
		wait = min(max(2*wait, redialFirstWait), redialMaxWait)
		r.cfg.Logger.Warn("release connection failed", "vhost", vhost, "err", err, "retry_in", wait)
	}
}
