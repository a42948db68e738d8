//go:build linux

package netns

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLink: a connection across the link carries bytes, goes silent when
// the link is cut (a read times out: no reset, no EOF) and carries the
// bytes written meanwhile once it is restored; both ways of crossing it,
// a socket made inside (Dial) and the forwarder (Forward).
func TestLink(t *testing.T) {
	for _, tt := range []struct {
		name string
		// connect returns a connection to an echo server, across l.
		connect func(t *testing.T, l *Link) net.Conn
	}{
		{"dial from inside", func(t *testing.T, l *Link) net.Conn {
			addr := echo(t, netip.AddrPortFrom(l.Host, 0).String())
			c, err := l.Dial(context.Background(), "tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
		{"forward from inside", func(t *testing.T, l *Link) net.Conn {
			addr := l.Forward(t, echo(t, "127.0.0.1:0"))
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := New(t)
			c := tt.connect(t, l)
			defer c.Close()
			roundTrip(t, c, "before", time.Second)

			l.Cut(t)
			l.Cut(t) // twice is once
			if _, err := c.Write([]byte("during")); err != nil {
				t.Fatalf("write while cut: %v (the kernel queues it)", err)
			}
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			var ne net.Error
			if n, err := c.Read(make([]byte, 16)); !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("read while cut: %d bytes, %v; want a timeout (silence)", n, err)
			}

			l.Restore(t)
			l.Restore(t)
			readWant(t, c, "during", 10*time.Second) // retransmitted
			roundTrip(t, c, "after", time.Second)
		})
	}
}

// TestRemoved: a link's namespace and veth pair are gone after its test,
// and a leftover of a process that is gone (a killed run) is removed when
// the next link is made.
func TestRemoved(t *testing.T) {
	var name string
	t.Run("link", func(t *testing.T) {
		name = New(t).Name
		if !exists(name) {
			t.Fatalf("%s: no namespace or veth end", name)
		}
	})
	if exists(name) {
		t.Errorf("%s still exists after its test", name)
	}

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	left := prefix + strconv.Itoa(dead.Process.Pid) + "-1"
	for _, args := range [][]string{
		{"netns", "add", left},
		{"link", "add", left, "type", "veth", "peer", "name", innerDev, "netns", left},
	} {
		if err := run("ip", args...); err != nil {
			deleteLink(left)
			t.Fatal(err)
		}
	}
	l := New(t)
	if exists(left) {
		deleteLink(left)
		t.Errorf("leftover %s not removed by New", left)
	}
	t.Logf("made %s: host %v, peer %v", l.Name, l.Host, l.Peer)
}

// exists reports whether a namespace or a veth end called name exists.
func exists(name string) bool {
	_, errNS := os.Stat(filepath.Join(runDir, name))
	_, errDev := os.Stat("/sys/class/net/" + name)
	return errNS == nil || errDev == nil
}

// echo serves, on addr in the test's namespace, connections that send back
// what they receive, until the test ends; it returns the address.
func echo(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // guards conns
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// roundTrip writes s to an echo connection and reads it back within d.
func roundTrip(t *testing.T, c net.Conn, s string, d time.Duration) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	readWant(t, c, s, d)
}

// readWant reads len(s) bytes within d and checks they are s.
func readWant(t *testing.T, c net.Conn, s string, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, len(s))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %q: %v", s, err)
	}
	if string(buf) != s {
		t.Fatalf("read %q, want %q", buf, s)
	}
}
