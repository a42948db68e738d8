//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// innerDev is the name of the veth end inside a link's namespace.
const innerDev = "eth0"

// Link is a network namespace joined to the test's namespace by a veth
// pair.
type Link struct {
	// Name is the namespace's name, and the name of the veth end in the
	// test's namespace.
	Name string
	// Host is the address of the veth end in the test's namespace, Peer
	// that of the end inside the namespace; both in one /30.
	Host, Peer netip.Addr

	ns *os.File // the namespace (/run/netns/<Name>), joined by inside

	mu  sync.Mutex // guards cut
	cut bool       // the blackhole qdiscs are in place
}

// New makes a link for t and removes it in t.Cleanup. It fails the test
// when it cannot.
func New(t testing.TB) *Link {
	t.Helper()
	l, err := create()
	if err != nil {
		t.Fatalf("netns: %v\n(the silent-partition tests need Linux, root and iproute2: ip netns, veth and tc's blackhole qdisc; they never skip)", err)
	}
	t.Cleanup(func() {
		if err := l.remove(); err != nil {
			t.Errorf("netns: remove %s: %v", l.Name, err)
		}
	})
	return l
}

// Dial connects to addr from inside the namespace: the connection's
// packets cross the link.
func (l *Link) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.inside(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// listen listens on addr inside the namespace.
func (l *Link) listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := l.inside(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// inside runs f on an OS thread that has joined the namespace: the sockets
// f creates belong to the namespace for as long as they live. The thread
// is thrown away after f: its goroutine ends still locked to it, so the
// runtime terminates it rather than give other goroutines a thread in
// another namespace (and since Go 1.10 it starts no new thread from a
// locked one).
func (l *Link) inside(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(l.ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netns: join %s: %w", l.Name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Cut drops every packet on the link, both ways, until Restore: TCP
// connections across it go quiet, and neither end is told. Cutting a cut
// link does nothing.
func (l *Link) Cut(t testing.TB) {
	t.Helper()
	if err := l.setCut(true); err != nil {
		t.Fatalf("netns: cut %s: %v", l.Name, err)
	}
}

// Restore lets packets through again after Cut; connections whose ends
// are still waiting resume. Restoring a link that is not cut does
// nothing.
func (l *Link) Restore(t testing.TB) {
	t.Helper()
	if err := l.setCut(false); err != nil {
		t.Fatalf("netns: restore %s: %v", l.Name, err)
	}
}

// setCut puts (cut) or takes away a blackhole qdisc as the root qdisc of
// both veth ends: each drops what leaves through it.
func (l *Link) setCut(cut bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut == cut {
		return nil
	}
	var errs []error
	if cut {
		errs = append(errs,
			run("tc", "qdisc", "replace", "dev", l.Name, "root", "blackhole"),
			run("tc", "-n", l.Name, "qdisc", "replace", "dev", innerDev, "root", "blackhole"))
	} else {
		errs = append(errs,
			run("tc", "qdisc", "del", "dev", l.Name, "root"),
			run("tc", "-n", l.Name, "qdisc", "del", "dev", innerDev, "root"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	l.cut = cut
	return nil
}
