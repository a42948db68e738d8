package amqpproxy

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// recvTimeConn is a client's TCP connection read with recvmsg, with the
// kernel's receive time of each read's bytes (SO_TIMESTAMPNS): for TCP,
// the time the last segment that read took from reached this host.
// Every byte a read returns arrived at or before it.
type recvTimeConn struct {
	*net.TCPConn
	rc   syscall.RawConn
	last int64 // receive time of the last read, unix ns; 0: not told

	// recvmsg is the read rc runs, made once so that a read allocates
	// nothing; it reads into p and oob and leaves n, oobn and err.
	recvmsg func(fd uintptr) bool
	p, oob  []byte
	n, oobn int
	err     error
}

// withRecvTime returns c, reading with receive times where the kernel gives
// them, and what tells the receive time of its last read (nil where it
// cannot: not TCP, or the socket option refused).
func withRecvTime(c net.Conn) (net.Conn, recvTimer) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c, nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		return c, nil
	}
	r := &recvTimeConn{TCPConn: tc, rc: rc, oob: make([]byte, syscall.CmsgSpace(timespecSize))}
	r.recvmsg = func(fd uintptr) bool {
		for {
			r.n, r.oobn, _, _, r.err = syscall.Recvmsg(int(fd), r.p, r.oob, 0)
			if r.err != syscall.EINTR {
				return r.err != syscall.EAGAIN
			}
		}
	}
	return r, r
}

const timespecSize = int(unsafe.Sizeof(syscall.Timespec{}))

// Read is net.Conn's Read (deadlines and closing included), by recvmsg.
// Only the connection's reader calls it.
func (c *recvTimeConn) Read(p []byte) (int, error) {
	c.p, c.last = p, 0
	err := c.rc.Read(c.recvmsg)
	c.p = nil
	if err != nil {
		return 0, err
	}
	if c.err != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("recvmsg", c.err)}
	}
	if c.n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	c.last = recvTime(c.oob[:c.oobn])
	return c.n, nil
}

// recvTime is the SCM_TIMESTAMPNS time among the control messages in oob,
// unix ns; 0 when there is none.
func recvTime(oob []byte) int64 {
	hdr := syscall.CmsgLen(0)
	for len(oob) >= hdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < hdr || l > len(oob) {
			return 0
		}
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS && l >= syscall.CmsgLen(timespecSize) {
			return (*syscall.Timespec)(unsafe.Pointer(&oob[hdr])).Nano()
		}
		oob = oob[min(syscall.CmsgSpace(l-hdr), len(oob)):]
	}
	return 0
}

// lastRecv is the receive time of the last read's bytes; the zero time
// when the kernel did not say.
func (c *recvTimeConn) lastRecv() time.Time {
	if c.last == 0 {
		return time.Time{}
	}
	return time.Unix(0, c.last)
}
