package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/admin"
)

// The test binary doubles as delayproxy: with DELAYPROXY_TEST_MAIN=1 it runs
// main with the arguments after "--".
func TestMain(m *testing.M) {
	if os.Getenv("DELAYPROXY_TEST_MAIN") == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"delayproxy"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		return
	}
	os.Exit(m.Run())
}

// command prepares the binary as delayproxy with args and DELAYPROXY_*
// settings (the caller's own DELAYPROXY_* variables are dropped).
func command(t *testing.T, env map[string]string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYPROXY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "DELAYPROXY_TEST_MAIN=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

func TestCommands(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		args     []string
		code     int
		stdout   string
		stderr   string
		noStdout bool
	}{
		{name: "version", args: []string{"version"}, stdout: "delayproxy "},
		{name: "--version", args: []string{"--version"}, stdout: "delayproxy "},
		{name: "help", args: []string{"--help"}, stderr: "DELAYPROXY_UPSTREAM", noStdout: true},
		{name: "bad flag", args: []string{"--max-delay", "soon"}, code: 2, stderr: "--max-delay (DELAYPROXY_MAX_DELAY)"},
		{name: "public HTTP without token", env: map[string]string{"DELAYPROXY_HTTP_ADDR": "0.0.0.0:15673"}, code: 2, stderr: "--admin-token"},
		{name: "healthcheck with nothing running", args: []string{"healthcheck", "--http-addr", "127.0.0.1:" + freePort(t)}, code: 1, stderr: "healthcheck"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, stdout, stderr := command(t, tt.env, tt.args...)
			err := cmd.Run()
			if got := exitCode(err); got != tt.code {
				t.Errorf("exit %d (%v), want %d; stderr: %s", got, err, tt.code, stderr)
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout %q lacks %q", stdout, tt.stdout)
			}
			if tt.noStdout && stdout.Len() > 0 {
				t.Errorf("stdout not empty: %q", stdout)
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q lacks %q", stderr, tt.stderr)
			}
			if strings.Count(strings.TrimSpace(stderr.String()), "\n") > 0 && tt.code == 2 {
				t.Errorf("a configuration error takes more than one line: %q", stderr)
			}
		})
	}
}

// TestRunHealthcheckAndSIGTERM runs the proxy, probes it with the
// healthcheck command, and stops it with SIGTERM.
func TestRunHealthcheckAndSIGTERM(t *testing.T) {
	env := map[string]string{
		"DELAYPROXY_DATA_DIR":  t.TempDir() + "/data",
		"DELAYPROXY_HTTP_ADDR": "127.0.0.1:" + freePort(t),
		"DELAYPROXY_LOG_LEVEL": "debug",
	}
	cmd, _, stderr := command(t, env)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{}) // closed when the process has exited; then waitErr is set
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	// Poll until the HTTP side answers, with a deadline.
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := admin.Probe(ctx, env["DELAYPROXY_HTTP_ADDR"], "/healthz")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never healthy: %v; stderr: %s", err, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	hc, _, hcErr := command(t, env, "healthcheck")
	if err := hc.Run(); err != nil {
		t.Errorf("healthcheck: %v: %s", err, hcErr)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("exit after SIGTERM: %v; stderr: %s", waitErr, stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15s after SIGTERM; stderr: %s", stderr)
	}
	for _, want := range []string{"started", "shutting down"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("log lacks %q: %s", want, stderr)
		}
	}
	if _, err := os.Stat(env["DELAYPROXY_DATA_DIR"] + "/delayproxy.db"); err != nil {
		t.Errorf("store file: %v", err)
	}
}

// freePort returns a TCP port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
