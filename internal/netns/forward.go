//go:build linux

package netns

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// dialTimeout bounds a forwarder's dial of its target.
const dialTimeout = 5 * time.Second

// Forward listens inside the namespace, on Peer and a free port, and
// relays every connection accepted there to the TCP address to, dialled
// from the test's namespace. It returns the address it listens on: from
// the test's namespace, to is reached there only across the link, so a
// Cut partitions whatever connects through it. The relay stops in
// t.Cleanup (before the link is removed): the listener and every relayed
// connection are closed and its goroutines waited for.
func (l *Link) Forward(t testing.TB, to string) string {
	t.Helper()
	ln, err := l.listen("tcp", netip.AddrPortFrom(l.Peer, 0).String())
	if err != nil {
		t.Fatalf("netns: listen in %s: %v", l.Name, err)
	}
	f := &forwarder{ln: ln, to: to, conns: map[net.Conn]bool{}}
	f.wg.Go(f.accept)
	t.Cleanup(f.close)
	return ln.Addr().String()
}

// forwarder relays the connections of one listener to one address.
type forwarder struct {
	ln net.Listener
	to string
	wg sync.WaitGroup // the accept loop and every relay

	mu     sync.Mutex        // guards conns and closed
	conns  map[net.Conn]bool // both sockets of every relay in progress
	closed bool
}

func (f *forwarder) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		f.wg.Go(func() { f.relay(c) })
	}
}

// relay copies bytes both ways between in and a new connection to the
// target. An end that closes its side (EOF) is passed on as a half close;
// an error on either closes both.
func (f *forwarder) relay(in net.Conn) {
	defer in.Close()
	if !f.track(in) {
		return
	}
	defer f.untrack(in)
	out, err := net.DialTimeout("tcp", f.to, dialTimeout)
	if err != nil {
		return
	}
	defer out.Close()
	if !f.track(out) {
		return
	}
	defer f.untrack(out)
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		if _, err := io.Copy(dst, src); err != nil {
			dst.Close()
			src.Close()
			return
		}
		if hc, ok := dst.(interface{ CloseWrite() error }); ok {
			hc.CloseWrite()
		}
	}
	wg.Go(func() { pipe(out, in) })
	wg.Go(func() { pipe(in, out) })
	wg.Wait()
}

// track records c as open; false (with c closed) once the forwarder is
// closing.
func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return false
	}
	f.conns[c] = true
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// close stops accepting, closes every relayed connection and waits for
// the goroutines.
func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
