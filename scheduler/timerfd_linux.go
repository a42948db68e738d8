package scheduler

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// timerfdTimer is RealClock's timer on Linux: a timerfd on the monotonic
// clock, read through the runtime's netpoller, and a Go timer armed for the
// same deadline; whichever expires first sends on c. Each covers the
// other's blind spot:
//
//   - Go's timers wake an idle process from epoll_wait, whose timeout is
//     whole milliseconds, so they fire up to a millisecond late; a timerfd
//     wakes the same epoll_wait at its hrtimer's deadline (plus the
//     kernel's timer slack, 50 µs by default).
//   - The netpoller, which reports the fd, is polled only by a processor
//     that found no goroutine to run (or by the runtime's monitor, every
//     10 ms), so while the process's run queues stay busy the fd's
//     expiry waits; Go's timers run at every scheduling point.
//
// It takes no thread while it waits. Two goroutines, one reading the fd
// and one receiving from the Go timer, send on c; Stop closes the fd, stops
// the Go timer and waits for both. ResetAt re-arms the fd only for a
// deadline earlier than the one it is armed for: a later one (the
// scheduler's loop arms a later wake-up on most turns) is re-armed by the
// reader when the fd expires first, so a loop turning thousands of times a
// second makes no syscall for it. The Go timer is re-armed every time (no
// syscall).
type timerfdTimer struct {
	fd   int      // for timerfd_settime: f.Fd() would make the fd blocking
	f    *os.File // for reads through the netpoller
	gt   *time.Timer
	c    chan time.Time
	quit chan struct{} // closed by Stop: ends the Go timer's goroutine
	wg   sync.WaitGroup

	mu       sync.Mutex // guards the fields below, the fd's arming, gt's arming and sends on c
	deadline time.Time  // monotonic reading a value on c is owed for; zero when none is
	fdAt     time.Time  // when the fd is armed to expire; zero when it is not
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
		gt:   time.NewTimer(time.Hour),           // armed by ResetAt below
		c:    make(chan time.Time, 1),
		quit: make(chan struct{}),
	}
	t.wg.Go(t.read)
	t.wg.Go(t.receive)
	t.ResetAt(time.Now().Add(d))
	return t
}

func (t *timerfdTimer) C() <-chan time.Time { return t.c }

// ResetAt sets the deadline at, converted to a monotonic reading as
// time.Timer would, arms the Go timer for it and the fd unless the fd
// already expires no later. Arming resets the fd's count of expirations,
// and an expiration before the deadline is dropped, so no value from an
// earlier arming arrives after ResetAt returns.
func (t *timerfdTimer) ResetAt(at time.Time) {
	now := time.Now()
	d := max(at.Sub(now), 1) // a zero it_value would disarm the fd
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.drain()
	t.deadline = now.Add(d)
	t.gt.Reset(d) // from a later reading than now: never before the deadline
	if t.fdAt.IsZero() || t.deadline.Before(t.fdAt) {
		t.settime(now, d)
	}
}

// Stop disarms the timer for good, closes its fd, stops its Go timer and
// waits for both goroutines.
func (t *timerfdTimer) Stop() {
	t.mu.Lock()
	stopped := t.stopped
	t.stopped, t.deadline = true, time.Time{}
	t.gt.Stop()
	t.drain()
	t.mu.Unlock()
	if !stopped {
		_ = t.f.Close() // wakes the blocked Read with ErrClosed
		close(t.quit)
	}
	t.wg.Wait()
}

// read sends the time on c once an expiration of the fd reaches the
// deadline, and re-arms the fd for the deadline after an earlier one, until
// Stop closes the fd.
func (t *timerfdTimer) read() {
	var count [8]byte // the number of expirations since the last read
	for {
		if _, err := t.f.Read(count[:]); err != nil {
			return
		}
		t.mu.Lock()
		t.fdAt = time.Time{}
		now := time.Now()
		t.fire(now)
		if !t.deadline.IsZero() { // the fd expired before the deadline
			t.settime(now, t.deadline.Sub(now))
		}
		t.mu.Unlock()
	}
}

// receive sends the time on c once the Go timer expires at the deadline,
// until Stop.
func (t *timerfdTimer) receive() {
	for {
		select {
		case <-t.gt.C:
			t.mu.Lock()
			t.fire(time.Now())
			t.mu.Unlock()
		case <-t.quit:
			return
		}
	}
}

// fire sends now on c if a value is owed and now reached its deadline,
// and then owes nothing more; t.mu is held.
func (t *timerfdTimer) fire(now time.Time) {
	if t.deadline.IsZero() || now.Before(t.deadline) {
		return
	}
	t.deadline = time.Time{}
	select {
	case t.c <- now:
	default:
	}
}

// settime arms the fd to expire once, d after now (the caller's reading);
// t.mu is held, so the fd is open (Stop closes it once stopped is set). Its
// only errors are EBADF, EFAULT and EINVAL, none possible for an open
// timerfd and a positive value; were one returned, fdAt stays zero and the
// next ResetAt arms again.
func (t *timerfdTimer) settime(now time.Time, d time.Duration) {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	if unix.TimerfdSettime(t.fd, 0, &spec, nil) == nil {
		t.fdAt = now.Add(d) // the kernel's expiry is a little later
	}
}

func (t *timerfdTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}
