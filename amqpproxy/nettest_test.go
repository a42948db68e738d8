package amqpproxy

import (
	"net"
	"sync"
	"testing"
)

// forwarder relays TCP (or TLS, by its listener) connections to a target,
// and can cut them or freeze them to play a dead peer.
type forwarder struct {
	l      net.Listener
	target string

	mu     sync.Mutex // guards conns, frozen, thaw
	conns  map[net.Conn]struct{}
	frozen bool
	thaw   chan struct{}

	wg sync.WaitGroup
}

func startForwarder(t testing.TB, l net.Listener, target string) *forwarder {
	f := &forwarder{l: l, target: target, conns: map[net.Conn]struct{}{}, thaw: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns[c], f.conns[up] = struct{}{}, struct{}{}
			f.mu.Unlock()
			f.wg.Add(2)
			go f.pipe(c, up)
			go f.pipe(up, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		f.cut()
		f.unfreeze()
		f.wg.Wait()
	})
	return f
}

func (f *forwarder) pipe(dst, src net.Conn) {
	defer f.wg.Done()
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

// cut closes every relayed connection at once.
func (f *forwarder) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
}

// freeze stops relaying bytes; the sockets stay open.
func (f *forwarder) freeze() {
	f.mu.Lock()
	f.frozen = true
	f.mu.Unlock()
}

func (f *forwarder) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.frozen = false
		close(f.thaw)
		f.thaw = make(chan struct{})
	}
}

func (f *forwarder) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

func listen(t testing.TB) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}
