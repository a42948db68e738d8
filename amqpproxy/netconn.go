package amqpproxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
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
}

func (r *readTimer) Read(p []byte) (int, error) {
	var d time.Time
	if idle := r.idle.Load(); idle > 0 {
		d = time.Now().Add(time.Duration(idle))
	}
	if abs := r.deadline.Load(); abs > 0 && (d.IsZero() || abs < d.UnixNano()) {
		d = time.Unix(0, abs)
	}
	if err := r.Conn.SetReadDeadline(d); err != nil {
		return 0, err
	}
	return r.Conn.Read(p)
}

// setDeadline sets (or, with the zero time, clears) the absolute deadline.
func (r *readTimer) setDeadline(t time.Time) {
	if t.IsZero() {
		r.deadline.Store(0)
		return
	}
	r.deadline.Store(t.UnixNano())
}

// setDeadlineBefore moves the absolute deadline to t unless it is already
// earlier.
func (r *readTimer) setDeadlineBefore(t time.Time) {
	for {
		old := r.deadline.Load()
		if old != 0 && old <= t.UnixNano() {
			return
		}
		if r.deadline.CompareAndSwap(old, t.UnixNano()) {
			return
		}
	}
}

// isTimeout reports whether err is a deadline that expired.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, errDeadline) || (errors.As(err, &ne) && ne.Timeout())
}

var errDeadline = errors.New("deadline exceeded")

// setNoDelay turns Nagle off on TCP connections (Go's default, made explicit
// because the relay depends on it).
func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
}

// upstreamAddr is where the proxy dials RabbitMQ.
type upstreamAddr struct {
	hostport string
	tls      *tls.Config // nil for amqp://
}

// parseUpstream reads an amqp:// or amqps:// URL. User, password and vhost
// in it are ignored: every client logs in with its own.
func parseUpstream(raw string, tlsConf *tls.Config) (upstreamAddr, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return upstreamAddr{}, fmt.Errorf("amqpproxy: upstream URL: %w", err)
	}
	var a upstreamAddr
	port := "5672"
	switch strings.ToLower(u.Scheme) {
	case "amqp":
	case "amqps":
		port = "5671"
		if tlsConf == nil {
			a.tls = &tls.Config{}
		} else {
			a.tls = tlsConf.Clone()
		}
		if a.tls.ServerName == "" {
			a.tls.ServerName = u.Hostname()
		}
	default:
		return upstreamAddr{}, fmt.Errorf("amqpproxy: upstream URL %q: scheme must be amqp or amqps", raw)
	}
	if u.Hostname() == "" {
		return upstreamAddr{}, fmt.Errorf("amqpproxy: upstream URL %q has no host", raw)
	}
	if u.Port() != "" {
		port = u.Port()
	}
	a.hostport = net.JoinHostPort(u.Hostname(), port)
	return a, nil
}
