package amqpproxy

import (
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// readTimer sets a read deadline before every Read of the connection under
// it: the idle timeout (two heartbeat intervals) from now, or an absolute
// deadline (handshake, waiting for a close-ok) when that comes first. Time
// the reader spends blocked elsewhere (a full writer queue) does not count
// against the peer.
type readTimer struct {
	net.Conn
	idle     atomic.Int64 // nanoseconds; 0: none
	deadline atomic.Int64 // unix nanoseconds; 0: none
	cur      atomic.Int64 // unix nanoseconds: the deadline of the Read in progress; 0: none
}

func (r *readTimer) Read(p []byte) (int, error) {
	d := r.next()
	if err := r.set(d); err != nil {
		return 0, err
	}
	// setDeadlineBefore may have moved the deadline between next and set,
	// and then set its own before this Read's: look again.
	if again := r.next(); !again.IsZero() && (d.IsZero() || again.Before(d)) {
		if err := r.set(again); err != nil {
			return 0, err
		}
	}
	return r.Conn.Read(p)
}

// next is the deadline a Read starting now gets.
func (r *readTimer) next() time.Time {
	var d time.Time
	if idle := r.idle.Load(); idle > 0 {
		d = time.Now().Add(time.Duration(idle))
	}
	if abs := r.deadline.Load(); abs > 0 && (d.IsZero() || abs < d.UnixNano()) {
		d = time.Unix(0, abs)
	}
	return d
}

func (r *readTimer) set(d time.Time) error {
	if d.IsZero() {
		r.cur.Store(0)
	} else {
		r.cur.Store(d.UnixNano())
	}
	return r.Conn.SetReadDeadline(d)
}

// setDeadline sets (or, with the zero time, clears) the absolute deadline
// of the Reads to come.
func (r *readTimer) setDeadline(t time.Time) {
	if t.IsZero() {
		r.deadline.Store(0)
		return
	}
	r.deadline.Store(t.UnixNano())
}

// setDeadlineBefore moves the absolute deadline to t unless it is already
// earlier; a Read in progress with a later deadline ends at t too.
func (r *readTimer) setDeadlineBefore(t time.Time) {
	for {
		old := r.deadline.Load()
		if old != 0 && old <= t.UnixNano() {
			return
		}
		if r.deadline.CompareAndSwap(old, t.UnixNano()) {
			break
		}
	}
	if cur := r.cur.Load(); cur == 0 || t.UnixNano() < cur {
		r.cur.Store(t.UnixNano())
		_ = r.Conn.SetReadDeadline(t)
	}
}

// isTimeout reports whether err is a deadline that expired.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
