package crashtest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ReadyPrefix starts the line a child proxy writes on its standard output
// once it listens (the rest of the line says where, for its log reader).
const ReadyPrefix = "READY "

// Process is a proxy run as a child process: started, signalled or killed
// with SIGKILL, and started again with the same command line, environment
// and log file.
type Process struct {
	t    testing.TB
	path string
	args []string
	env  []string
	log  string // standard error of every run, appended

	mu  sync.Mutex // guards run
	run *run       // the running child, nil when none runs
}

// run is one run of the child.
type run struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the child exited; err is set then
	err  error         // cmd.Wait's result
}

// ErrStillRunning is wrapped by the error Wait and Stop return when the
// child did not exit in time.
var ErrStillRunning = errors.New("crashtest: child still running")

// NewProcess prepares a child process; Start or StartProbe runs it. The
// child's environment is the test's without its DELAYPROXY_* variables,
// plus env. Its standard error goes to logPath (appended across restarts).
// A child still running at the end of the test is killed.
func NewProcess(t testing.TB, logPath, path string, args, env []string) *Process {
	p := &Process{t: t, path: path, args: args, env: env, log: logPath}
	t.Cleanup(func() {
		if p.Pid() != 0 {
			p.Kill()
		}
	})
	return p
}

// Start runs the child and waits until it writes its ready line. It fails
// the test if the child exits first or is not ready within timeout.
func (p *Process) Start(timeout time.Duration) {
	p.t.Helper()
	p.start(timeout, nil)
}

// StartProbe runs a child that writes no ready line (the delayproxy
// command itself) and waits until probe returns nil, for example an HTTP
// probe of its /readyz. It fails the test if the child exits first or is
// not ready within timeout.
func (p *Process) StartProbe(timeout time.Duration, probe func() error) {
	p.t.Helper()
	p.start(timeout, probe)
}

// probeEvery is how often start asks probe whether the child is ready.
const probeEvery = 20 * time.Millisecond

// start runs the child and waits until it is ready: until it writes its
// ready line, or until probe returns nil when probe is not nil.
func (p *Process) start(timeout time.Duration, probe func() error) {
	p.t.Helper()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- crashtest: start %s\n", time.Now().Format(time.RFC3339Nano))
	ready := make(chan struct{}, 1)
	cmd := exec.Command(p.path, p.args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYPROXY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, p.env...)
	cmd.Stdout = &lineWatcher{ready: ready}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("crashtest: start %s: %v", p.path, err)
	}
	r := &run{cmd: cmd, done: make(chan struct{})}
	go func() { r.err = cmd.Wait(); close(r.done) }()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ready:
			if probe == nil {
				p.running(r)
				return
			}
		case <-tick.C:
			if probe != nil && probe() == nil {
				p.running(r)
				return
			}
		case <-r.done:
			p.t.Fatalf("crashtest: child exited before it was ready (%v); log %s:\n%s", r.err, p.log, p.Tail(40))
		case <-deadline.C:
			cmd.Process.Kill()
			<-r.done
			p.t.Fatalf("crashtest: child not ready after %v; log %s:\n%s", timeout, p.log, p.Tail(40))
		}
	}
}

// running records r as the running child.
func (p *Process) running(r *run) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run = r
}

// current is the running child; it fails the test when none runs. With
// take it is handed over to the caller, who waits for it: the Process has
// no child running any more.
func (p *Process) current(op string, take bool) *run {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.run
	if r == nil {
		p.t.Fatalf("crashtest: %s: no child running", op)
	}
	if take {
		p.run = nil
	}
	return r
}

// Pid is the running child's process id, 0 when none runs.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.run == nil {
		return 0
	}
	return p.run.cmd.Process.Pid
}

// Kill sends SIGKILL to the running child and waits for it to exit; it
// fails the test if the child had exited on its own.
func (p *Process) Kill() {
	p.t.Helper()
	r := p.current("Kill", true)
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("crashtest: SIGKILL: %v", err)
	}
	<-r.done
	var ee *exec.ExitError
	if !errors.As(r.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		p.t.Errorf("crashtest: child ended with %v before the SIGKILL; log %s:\n%s", r.err, p.log, p.Tail(40))
	}
}

// Signal sends sig to the running child, which still counts as running
// until Wait (or Stop, or Kill) saw it exit.
func (p *Process) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.current("Signal", false).cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("crashtest: signal %v: %v", sig, err)
	}
}

// Exited reports whether the running child has exited already, and its
// exit status (nil: exit 0) if so, without waiting.
func (p *Process) Exited() (bool, error) {
	p.t.Helper()
	r := p.current("Exited", false)
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// Wait waits up to timeout for the running child to exit and returns its
// exit status (nil: exit 0); after timeout it kills the child and returns
// an error wrapping ErrStillRunning.
func (p *Process) Wait(timeout time.Duration) error {
	p.t.Helper()
	r := p.current("Wait", true)
	select {
	case <-r.done:
		return r.err
	case <-time.After(timeout):
		r.cmd.Process.Kill()
		<-r.done
		return fmt.Errorf("%w %v after it was told to stop; killed", ErrStillRunning, timeout)
	}
}

// Stop sends SIGTERM to the running child and returns its exit status
// (nil: exit 0) once it exits, as Wait.
func (p *Process) Stop(timeout time.Duration) error {
	p.t.Helper()
	p.Signal(syscall.SIGTERM)
	return p.Wait(timeout)
}

// Log is the child's whole log (every run); a read error is its text.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// Tail is the last n lines of the child's log.
func (p *Process) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Log(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// LogContains reports whether the child's log (every run) contains s, for
// example the race detector's "WARNING: DATA RACE".
func (p *Process) LogContains(s string) bool {
	b, err := os.ReadFile(p.log)
	return err == nil && bytes.Contains(b, []byte(s))
}

// lineWatcher is a child's standard output: it signals ready once it saw
// the ready line and discards everything.
type lineWatcher struct {
	ready chan<- struct{} // capacity 1
	buf   []byte
	seen  bool
}

func (w *lineWatcher) Write(b []byte) (int, error) {
	if w.seen {
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := w.buf[:i]
		w.buf = w.buf[i+1:]
		if bytes.HasPrefix(line, []byte(ReadyPrefix)) {
			w.seen, w.buf = true, nil
			w.ready <- struct{}{}
			break
		}
	}
	return len(b), nil
}

// FreePort returns a loopback host:port that nothing listens on, below the
// kernel's ephemeral port range, so that neither a listener on port 0 nor
// an outgoing connection takes it while a child proxy is down between a
// kill and its restart.
func FreePort(t testing.TB) string {
	t.Helper()
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &lo)
	}
	if lo <= 12000 {
		t.Fatalf("crashtest: ephemeral ports start at %d, no room below them", lo)
	}
	for range 100 {
		port := 10000 + rand.IntN(lo-10000-1)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return addr
	}
	t.Fatal("crashtest: no free port found")
	return ""
}
