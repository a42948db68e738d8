package amqpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// loopbackPair returns both ends of a TCP connection over loopback, the
// accepted one read through withRecvTime.
func loopbackPair(t *testing.T) (accepted net.Conn, rt recvTimer, dialed net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialed.Close() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	accepted, rt = withRecvTime(c)
	t.Cleanup(func() { accepted.Close() })
	if rt == nil {
		t.Fatal("withRecvTime gave no receive times on a TCP connection")
	}
	if err := holdStamps(); err != nil {
		t.Fatal(err)
	}
	awaitStamps(t, accepted, rt, dialed)
	return accepted, rt, dialed
}

// holdStamps keeps receive times on for the whole host while the tests
// run, with a socket that asks for them and is never closed. The kernel
// turns them on when the first socket asks (net_enable_timestamp) and off
// when the last one closes, each in deferred work: without a socket that
// stays, a close by one of the parallel tests here can turn them off
// under a connection that already saw its bytes stamped.
var holdStamps = sync.OnceValue(func() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
})

// awaitStamps sends a byte over the pair and reads it until it comes
// stamped: the kernel turns receive times on in deferred work.
func awaitStamps(t *testing.T, c net.Conn, rt recvTimer, peer net.Conn) {
	t.Helper()
	buf := make([]byte, 1)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := peer.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		if !rt.lastRecv().IsZero() {
			return
		}
	}
	t.Fatal("no receive time on a TCP connection in 5 s")
}

// TestRecvTimeIsWhenTheBytesArrived: bytes that wait in the socket are
// stamped with their arrival, not with the read that takes them up, and
// each read stamps its own bytes.
func TestRecvTimeIsWhenTheBytesArrived(t *testing.T) {
	t.Parallel()
	c, rt, peer := loopbackPair(t)
	buf := make([]byte, 64)
	var prev time.Time
	for i := range 2 {
		before := time.Now()
		if _, err := peer.Write([]byte("frame")); err != nil {
			t.Fatal(err)
		}
		written := time.Now()
		time.Sleep(50 * time.Millisecond)
		reading := time.Now()
		if n, err := c.Read(buf); err != nil || string(buf[:n]) != "frame" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
		got := rt.lastRecv()
		if got.Before(before.Add(-time.Millisecond)) || got.After(written.Add(10*time.Millisecond)) {
			t.Fatalf("read %d: received at %v, written between %v and %v", i, got, before, written)
		}
		if waited := reading.Sub(got); waited < 40*time.Millisecond {
			t.Fatalf("read %d: waited %v in the socket, slept 50ms before reading", i, waited)
		}
		if !got.After(prev) {
			t.Fatalf("read %d: received at %v, not after the read before's %v", i, got, prev)
		}
		prev = got
	}
}

// TestRecvTimeOfAReadIsItsLastSegment: a read that takes up segments that
// arrived apart is stamped with the last one's arrival, so no byte it
// returns arrived after its stamp (an x-delay counted from it is never
// early).
func TestRecvTimeOfAReadIsItsLastSegment(t *testing.T) {
	t.Parallel()
	c, rt, peer := loopbackPair(t)
	if _, err := peer.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	second := time.Now()
	if _, err := peer.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "firstsecond" {
		t.Fatalf("read %q, %v: want both segments in one read", buf[:n], err)
	}
	if got := rt.lastRecv(); got.Before(second) {
		t.Fatalf("stamped %v before the second segment was written", second.Sub(got))
	}
}

// TestRecvTimeConnEndsReadsAsNetConn: a read through withRecvTime ends as
// one on the plain connection would, as the client reader tells them
// apart: at its deadline, at the peer's close, at its own close.
func TestRecvTimeConnEndsReadsAsNetConn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		end  func(c, peer net.Conn)
		is   func(error) bool
	}{
		{"deadline", func(c, _ net.Conn) { c.SetReadDeadline(time.Now().Add(20 * time.Millisecond)) }, isTimeout},
		{"peer closes", func(_, peer net.Conn) { peer.Close() }, func(err error) bool { return errors.Is(err, io.EOF) }},
		{"closed here", func(c, _ net.Conn) { time.AfterFunc(20*time.Millisecond, func() { c.Close() }) }, func(err error) bool { return errors.Is(err, net.ErrClosed) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, rt, peer := loopbackPair(t)
			tt.end(c, peer)
			_, err := c.Read(make([]byte, 8))
			if !tt.is(err) {
				t.Fatalf("read ended with %v", err)
			}
			if got := rt.lastRecv(); !got.IsZero() {
				t.Fatalf("a read that took nothing left the receive time %v", got)
			}
		})
	}
}

// FuzzRecvTime: any control message bytes give a time or 0, never a panic
// or a read past them.
func FuzzRecvTime(f *testing.F) {
	valid := make([]byte, syscall.CmsgSpace(timespecSize))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&valid[0]))
	h.Level, h.Type = syscall.SOL_SOCKET, syscall.SCM_TIMESTAMPNS
	h.SetLen(syscall.CmsgLen(timespecSize))
	*(*syscall.Timespec)(unsafe.Pointer(&valid[syscall.CmsgLen(0)])) = syscall.NsecToTimespec(1_800_000_000_123_456_789)
	if got := recvTime(valid); got != 1_800_000_000_123_456_789 {
		f.Fatalf("recvTime of a valid message = %d", got)
	}
	f.Add(valid)
	f.Add([]byte{})
	f.Add(valid[:syscall.CmsgLen(0)])
	f.Fuzz(func(t *testing.T, oob []byte) {
		aligned := make([]byte, len(oob)) // as the kernel fills them
		copy(aligned, oob)
		recvTime(aligned)
	})
}
