package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// pgServer is a PostgreSQL server of the test's own (initdb in a temporary
// directory, its own port, trust authentication), to stop, kill and
// promote at will: the shared server at 5432 is never touched. Its
// programs run as the postgres user, since initdb refuses root.
type pgServer struct {
	t    *testing.T
	bin  string // PostgreSQL's server programs
	dir  string // data directory
	port string
}

// pgBinDir is the newest PostgreSQL's server programs Debian installed
// (postgresql-NN, which .ci/postgres installs), or $PG_BIN.
func pgBinDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("PG_BIN"); d != "" {
		return d
	}
	ds, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(ds) == 0 {
		t.Fatal("no PostgreSQL server programs in /usr/lib/postgresql/*/bin (run .ci/postgres, or set PG_BIN)")
	}
	slices.SortFunc(ds, func(a, b string) int { return len(a) - len(b) }) // 9 < 15 < 16
	return filepath.Dir(ds[len(ds)-1])
}

// newPGDir makes an empty data directory the postgres user may write.
func newPGDir(t *testing.T) (*pgServer, string) {
	t.Helper()
	base, err := os.MkdirTemp("", "dp-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o777); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(crashtest.FreePort(t))
	s := &pgServer{t: t, bin: pgBinDir(t), dir: filepath.Join(base, "data"), port: port}
	t.Cleanup(func() { s.pgctl("stop", "-m", "immediate") })
	return s, base
}

// newPGServer creates and starts a server.
func newPGServer(t *testing.T) *pgServer {
	t.Helper()
	s, _ := newPGDir(t)
	// -N: no fsync wait at initdb only; the server itself runs with its
	// defaults (fsync and synchronous_commit on).
	s.run("initdb", "-D", s.dir, "-U", "postgres", "--auth=trust", "-N")
	s.start()
	return s
}

// newPGStandby creates a streaming standby of primary (pg_basebackup -R),
// starts it, and makes it the primary's synchronous standby: from then on
// a commit on the primary returns once the standby has it on disk.
func newPGStandby(t *testing.T, primary *pgServer) *pgServer {
	t.Helper()
	s, _ := newPGDir(t)
	s.run("pg_basebackup", "-h", "127.0.0.1", "-p", primary.port, "-U", "postgres", "-D", s.dir, "-R", "-X", "stream")
	s.start()
	primary.conf("synchronous_standby_names = '*'")
	primary.reload()
	testwait.Until(t, 30*time.Second, "the standby to stream synchronously", func() bool {
		out, _ := primary.psql("SELECT sync_state FROM pg_stat_replication")
		return strings.TrimSpace(out) == "sync"
	})
	return s
}

// URL is the server's connection URL.
func (s *pgServer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres", s.port)
}

// conf appends a setting to the server's postgresql.conf (read at start or
// reload; a standby made afterwards does not copy it).
func (s *pgServer) conf(line string) {
	s.t.Helper()
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fmt.Fprintln(f, line)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		s.t.Fatal(err)
	}
}

// start starts the server and waits until it accepts connections.
func (s *pgServer) start() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-w", "-l", filepath.Join(filepath.Dir(s.dir), "server.log"),
		"-o", fmt.Sprintf("-p %s -k %s -c listen_addresses=127.0.0.1", s.port, filepath.Dir(s.dir)), "start")
}

// reload makes the server read its configuration again.
func (s *pgServer) reload() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "reload")
}

// stop stops the server (mode fast: open sessions are cut, committed
// transactions are kept).
func (s *pgServer) stop() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-w", "-m", "fast", "stop")
}

// kill stops the server at once, as a crash does (mode immediate: no
// shutdown checkpoint, the postmaster's children are killed).
func (s *pgServer) kill() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-m", "immediate", "stop")
}

// promote makes a standby the primary and waits until it is.
func (s *pgServer) promote() {
	s.t.Helper()
	s.run("pg_ctl", "-D", s.dir, "-w", "promote")
}

// psql runs one query on the server, as psql's unaligned output.
func (s *pgServer) psql(query string) (string, error) {
	out, err := exec.Command("runuser", "-u", "postgres", "--", filepath.Join(s.bin, "psql"),
		"-h", "127.0.0.1", "-p", s.port, "-U", "postgres", "-w", "-Atc", query).CombinedOutput()
	return string(out), err
}

// pgctl runs pg_ctl on the server, ignoring its failure (cleanup).
func (s *pgServer) pgctl(args ...string) {
	exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(s.bin, "pg_ctl"), "-D", s.dir}, args...)...).Run()
}

// run runs one of PostgreSQL's programs as the postgres user.
func (s *pgServer) run(prog string, args ...string) {
	s.t.Helper()
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(s.bin, prog)}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("%s %v: %v\n%s", prog, args, err, out)
	}
}
