package scheduler

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// timerfdTimer is RealClock's timer on Linux: a timerfd on the monotonic
// clock, read through the runtime's netpoller. Go's own timers wake an idle
// process from epoll_wait, whose timeout is whole milliseconds, so they fire
// up to a millisecond late (half of one on average); a timerfd wakes the
// same epoll_wait at its hrtimer's deadline (plus the kernel's timer slack,
// 50 µs by default). It takes no thread while it waits.
//
// One goroutine reads the fd and sends on c; Stop closes the fd and waits
// for it.
type timerfdTimer struct {
	fd   int      // for timerfd_settime: f.Fd() would make the fd blocking
	f    *os.File // for reads through the netpoller
	c    chan time.Time
	done chan struct{} // closed when the reading goroutine returns

	mu       sync.Mutex // guards deadline, armed and stopped, and sends on c
	deadline time.Time  // monotonic reading
	armed    bool
	stopped  bool
}

// newRealTimer returns a timerfd timer, or a Go timer where the kernel
// refuses a timerfd.
func newRealTimer(d time.Duration) Timer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return goTimer{time.NewTimer(d)}
	}
	t := &timerfdTimer{
		fd:   fd,
		f:    os.NewFile(uintptr(fd), "timerfd"), // non-blocking: the netpoller waits on it
		c:    make(chan time.Time, 1),
		done: make(chan struct{}),
	}
	go t.read()
	t.ResetAt(time.Now().Add(d))
	return t
}

func (t *timerfdTimer) C() <-chan time.Time { return t.c }

// ResetAt arms the fd for at, converted to a monotonic deadline as
// time.Timer would. Arming resets the fd's count of expirations, and an
// expiration read before it is dropped by read's deadline check, so no
// value from an earlier arming arrives after ResetAt returns.
func (t *timerfdTimer) ResetAt(at time.Time) {
	now := time.Now()
	d := max(at.Sub(now), 1) // a zero it_value would disarm the fd
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.drain()
	t.deadline, t.armed = now.Add(d), true
	t.settime(d)
}

// Stop disarms the timer for good, closes its fd and waits for the reading
// goroutine.
func (t *timerfdTimer) Stop() {
	t.mu.Lock()
	stopped := t.stopped
	t.stopped, t.armed = true, false
	t.drain()
	t.mu.Unlock()
	if !stopped {
		_ = t.f.Close() // wakes the blocked Read with ErrClosed
	}
	<-t.done
}

// read sends the time on c for each expiration that reaches the current
// deadline, until Stop closes the fd.
func (t *timerfdTimer) read() {
	defer close(t.done)
	var count [8]byte // the number of expirations since the last read
	for {
		if _, err := t.f.Read(count[:]); err != nil {
			return
		}
		t.mu.Lock()
		if now := time.Now(); t.armed && !now.Before(t.deadline) {
			t.armed = false
			select {
			case t.c <- now:
			default:
			}
		}
		t.mu.Unlock()
	}
}

// settime arms the fd to expire once, d from now; t.mu is held and the fd
// open (Stop closes it only once stopped is set). A failure
// (none is documented for a valid fd and value) leaves the loop to its next
// turn: callers bound every sleep (maxSleep, the lease's renewal).
func (t *timerfdTimer) settime(d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	_ = unix.TimerfdSettime(t.fd, 0, &spec, nil)
}

func (t *timerfdTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}
