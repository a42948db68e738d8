package scheduler

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// timerfdTimer is RealClock's timer on Linux: a Go timer, whose channel is
// C, and a timerfd on the monotonic clock armed for the same deadline, read
// through the runtime's netpoller. Each covers the other's blind spot:
//
//   - Go's timers wake an idle process from epoll_wait, whose timeout is
//     whole milliseconds, so they fire up to a millisecond late; a timerfd
//     wakes the same epoll_wait at its hrtimer's deadline (plus the
//     kernel's timer slack, 50 µs by default).
//   - The netpoller, which reports the fd, is polled only by a processor
//     that found no goroutine to run (or by the runtime's monitor, every
//     10 ms), so while the process's run queues stay busy the fd's expiry
//     waits; Go's timers run at every scheduling point.
//
// When the fd expires at the deadline first, its reader fires the Go timer
// at once (Reset(0)), unless its value for this arming was received
// already (Stop reports false: Go 1.23's timer channels); so C gets one
// value per arming, whichever expires first. ResetAt re-arms the fd only
// for a deadline earlier than the one it is armed for: a later one (the
// scheduler's loop arms a later wake-up on most turns) is re-armed by the
// reader when the fd expires first, so a loop turning thousands of times a
// second makes no syscall for it. It takes no thread while it waits; Stop
// closes the fd and waits for the reader.
type timerfdTimer struct {
	fd   int      // for timerfd_settime: f.Fd() would make the fd blocking
	f    *os.File // for reads through the netpoller
	gt   *time.Timer
	done chan struct{} // closed when the reading goroutine returns

	mu       sync.Mutex // guards the fields below, the fd's arming and gt's
	deadline time.Time  // monotonic reading of this arming's deadline, for the fd's reader; zero once it saw it pass, or stopped
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
		done: make(chan struct{}),
	}
	go t.read()
	t.ResetAt(time.Now().Add(d))
	return t
}

func (t *timerfdTimer) C() <-chan time.Time { return t.gt.C }

// ResetAt sets the deadline at, converted to a monotonic reading as
// time.Timer would, and arms the Go timer for it, and the fd unless the fd
// already expires no later. Arming resets the fd's count of expirations and
// the reader drops an expiration before the deadline, so no value from an
// earlier arming arrives after ResetAt returns.
func (t *timerfdTimer) ResetAt(at time.Time) {
	now := time.Now()
	d := max(at.Sub(now), 1) // a zero it_value would disarm the fd
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.deadline = now.Add(d)
	t.gt.Reset(d) // counts from a later reading than now: never before the deadline
	if t.fdAt.IsZero() || t.deadline.Before(t.fdAt) {
		t.settime(now, d)
	}
}

// Stop disarms the timer for good, closes its fd and waits for the reading
// goroutine.
func (t *timerfdTimer) Stop() {
	t.mu.Lock()
	stopped := t.stopped
	t.stopped, t.deadline = true, time.Time{}
	t.gt.Stop()
	t.mu.Unlock()
	if !stopped {
		_ = t.f.Close() // wakes the blocked Read with ErrClosed
	}
	<-t.done
}

// read fires the Go timer once an expiration of the fd reaches the
// deadline (unless it fired on its own and was received), and re-arms the
// fd for the deadline after an earlier one, until Stop closes the fd.
func (t *timerfdTimer) read() {
	defer close(t.done)
	var count [8]byte // the number of expirations since the last read
	for {
		if _, err := t.f.Read(count[:]); err != nil {
			return
		}
		t.mu.Lock()
		t.fdAt = time.Time{}
		switch now := time.Now(); {
		case t.deadline.IsZero(): // fired already, or stopped
		case now.Before(t.deadline):
			t.settime(now, t.deadline.Sub(now))
		default:
			t.deadline = time.Time{}
			if t.gt.Stop() { // its value is still owed: send it now
				t.gt.Reset(0)
			}
		}
		t.mu.Unlock()
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
