// Package testforward relays TCP (or TLS, by its listener) connections to a
// target for a test, and can cut them, freeze them to play a dead peer, or
// hold new ones before they reach the target, to play a slow one.
package testforward

import (
	"net"
	"sync"
	"testing"
)

// Forwarder relays each connection its listener accepts to the target.
type Forwarder struct {
	l      net.Listener
	target string

	mu      sync.Mutex // guards closing, conns, frozen, thaw, holding, held and let
	closing bool       // the test is over: no new connection is relayed
	conns   map[net.Conn]struct{}
	frozen  bool
	thaw    chan struct{}
	// holding: connections accepted from now on wait, not yet dialled to
	// the target, until Let; held counts those waiting.
	holding bool
	held    int
	let     chan struct{}

	wg sync.WaitGroup // the accept loop and every pipe
}

// Start relays the connections l accepts to target until the end of the
// test, when it closes l and every connection and waits for its
// goroutines.
func Start(t testing.TB, l net.Listener, target string) *Forwarder {
	f := &Forwarder{l: l, target: target, conns: map[net.Conn]struct{}{}, thaw: make(chan struct{}), let: make(chan struct{})}
	f.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.relay(c) })
		}
	})
	t.Cleanup(func() {
		f.mu.Lock()
		f.closing = true
		f.mu.Unlock()
		l.Close()
		f.Let()
		f.Cut()
		f.Unfreeze()
		f.wg.Wait()
	})
	return f
}

// Addr is where the Forwarder listens.
func (f *Forwarder) Addr() string { return f.l.Addr().String() }

func (f *Forwarder) relay(c net.Conn) {
	f.mu.Lock()
	if f.holding {
		f.held++
		let := f.let
		f.mu.Unlock()
		<-let
		f.mu.Lock()
		f.held--
	}
	f.mu.Unlock()
	up, err := net.Dial("tcp", f.target)
	if err != nil {
		c.Close()
		return
	}
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	f.conns[c], f.conns[up] = struct{}{}, struct{}{}
	f.mu.Unlock()
	f.wg.Go(func() { f.pipe(c, up) })
	f.pipe(up, c)
}

func (f *Forwarder) pipe(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
		f.mu.Lock()
		delete(f.conns, dst)
		delete(f.conns, src)
		f.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			thaw, frozen := f.thaw, f.frozen
			f.mu.Unlock()
			if frozen {
				<-thaw
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut closes every relayed connection at once.
func (f *Forwarder) Cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
}

// Freeze stops relaying bytes; the sockets stay open.
func (f *Forwarder) Freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

// Unfreeze relays bytes again.
func (f *Forwarder) Unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.frozen = false
		close(f.thaw)
		f.thaw = make(chan struct{})
	}
}

// Hold makes connections accepted from now on wait before they are
// relayed, until Let: their clients' handshakes hang.
func (f *Forwarder) Hold() {
	f.mu.Lock()
	f.holding = true
	f.mu.Unlock()
}

// Let relays the held connections and stops holding new ones.
func (f *Forwarder) Let() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holding {
		f.holding = false
		close(f.let)
		f.let = make(chan struct{})
	}
}

// Held is the number of connections waiting for Let.
func (f *Forwarder) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}

// Open is the number of relayed connections open, both sides counted.
func (f *Forwarder) Open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}
