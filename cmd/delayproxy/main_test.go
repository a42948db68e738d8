package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/crashtest"
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
	cmd := exec.Command(os.Args[0], childArgs(args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYPROXY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, childEnv(env)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	return cmd, &stdout, &stderr
}

// newChild prepares the binary as delayproxy, run by crashtest (which also
// drops the caller's DELAYPROXY_* variables), with the DELAYPROXY_*
// settings env; its log goes to a file of the test's.
func newChild(t *testing.T, env map[string]string) *crashtest.Process {
	t.Helper()
	return crashtest.NewProcess(t, filepath.Join(t.TempDir(), "delayproxy.log"), os.Args[0], childArgs(), childEnv(env))
}

// childArgs are the test binary's arguments that run main with args.
func childArgs(args ...string) []string {
	return append([]string{"-test.run=^$", "--"}, args...)
}

// childEnv are the settings env as KEY=value, with the one that makes the
// test binary run main.
func childEnv(env map[string]string) []string {
	kvs := []string{"DELAYPROXY_TEST_MAIN=1"}
	for k, v := range env {
		kvs = append(kvs, k+"="+v)
	}
	return kvs
}

// probe is a readiness probe of a child's HTTP path (admin.Probe, 1 s).
func probe(httpAddr, path string) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return admin.Probe(ctx, httpAddr, path)
	}
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
		{name: "healthcheck with nothing running", args: []string{"healthcheck", "--http-addr", crashtest.FreePort(t)}, code: 1, stderr: "healthcheck"},
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
		"DELAYPROXY_HTTP_ADDR": crashtest.FreePort(t),
		"DELAYPROXY_LOG_LEVEL": "debug",
	}
	p := newChild(t, env)
	p.StartProbe(15*time.Second, probe(env["DELAYPROXY_HTTP_ADDR"], "/healthz"))
	hc, _, hcErr := command(t, env, "healthcheck")
	if err := hc.Run(); err != nil {
		t.Errorf("healthcheck: %v: %s", err, hcErr)
	}

	if err := p.Stop(15 * time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v; log: %s", err, p.Tail(40))
	}
	for _, want := range []string{"started", "shutting down"} {
		if !p.LogContains(want) {
			t.Errorf("log lacks %q: %s", want, p.Tail(40))
		}
	}
	if _, err := os.Stat(env["DELAYPROXY_DATA_DIR"] + "/delayproxy.db"); err != nil {
		t.Errorf("store file: %v", err)
	}
}
