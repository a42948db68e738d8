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
// once it listens; the rest of the line is for the parent.
const ReadyPrefix = "READY "

// Process is a proxy run as a child process: started, killed with SIGKILL
// and started again with the same command line, environment and log file.
type Process struct {
	t    testing.TB
	path string
	args []string
	env  []string
	log  string // standard error of every run, appended

	mu     sync.Mutex // guards cmd, exited and ready
	cmd    *exec.Cmd  // the running child, nil when none runs
	exited chan error // receives cmd's exit status once
	ready  string
}

// NewProcess prepares a child process; Start runs it. The child's standard
// error goes to logPath (appended across restarts). A child still running
// at the end of the test is killed.
func NewProcess(t testing.TB, logPath, path string, args, env []string) *Process {
	p := &Process{t: t, path: path, args: args, env: env, log: logPath}
	t.Cleanup(func() {
		if p.Pid() != 0 {
			p.Kill()
		}
	})
	return p
}

// Start runs the child and waits until it writes its ready line, which it
// returns without the prefix. It fails the test if the child exits first or
// is not ready within timeout.
func (p *Process) Start(timeout time.Duration) string {
	p.t.Helper()
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- crashtest: start %s\n", time.Now().Format(time.RFC3339Nano))
	ready := make(chan string, 1)
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout = &lineWatcher{ready: ready}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("crashtest: start %s: %v", p.path, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line := <-ready:
		p.mu.Lock()
		p.cmd, p.exited, p.ready = cmd, exited, line
		p.mu.Unlock()
		return line
	case err := <-exited:
		p.t.Fatalf("crashtest: child exited before it was ready (%v); log %s:\n%s", err, p.log, p.Tail(40))
	case <-timer.C:
		cmd.Process.Kill()
		<-exited
		p.t.Fatalf("crashtest: child not ready after %v; log %s:\n%s", timeout, p.log, p.Tail(40))
	}
	return ""
}

// take hands the running child over to the caller, who waits for it.
func (p *Process) take(op string) (*exec.Cmd, chan error) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd, exited := p.cmd, p.exited
	if cmd == nil {
		p.t.Fatalf("crashtest: %s: no child running", op)
	}
	p.cmd, p.exited = nil, nil
	return cmd, exited
}

// Ready is the ready line of the current run.
func (p *Process) Ready() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

// Pid is the running child's process id, 0 when none runs.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL to the running child and waits for it to exit; it
// fails the test if the child had exited on its own.
func (p *Process) Kill() {
	p.t.Helper()
	cmd, exited := p.take("Kill")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("crashtest: SIGKILL: %v", err)
	}
	err := <-exited
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		p.t.Errorf("crashtest: child ended with %v before the SIGKILL; log %s:\n%s", err, p.log, p.Tail(40))
	}
}

// Stop sends SIGTERM to the running child and returns its exit status
// (nil: exit 0) once it exits, or an error after timeout (it is then
// killed).
func (p *Process) Stop(timeout time.Duration) error {
	p.t.Helper()
	cmd, exited := p.take("Stop")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-exited:
		return err
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-exited
		return fmt.Errorf("crashtest: child still running %v after SIGTERM; killed", timeout)
	}
}

// Tail is the last n lines of the child's log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// LogContains reports whether the child's log (every run) contains s, for
// example the race detector's "WARNING: DATA RACE".
func (p *Process) LogContains(s string) bool {
	b, err := os.ReadFile(p.log)
	return err == nil && bytes.Contains(b, []byte(s))
}

// lineWatcher is a child's standard output: it hands the first ready line
// to ready and discards the rest.
type lineWatcher struct {
	ready chan string
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
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if rest, ok := strings.CutPrefix(line, ReadyPrefix); ok {
			w.seen, w.buf = true, nil
			w.ready <- rest
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
