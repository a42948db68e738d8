package boltstore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

// crashChildEnv switches the test binary into the crash child: it names the
// store file to write to.
const crashChildEnv = "DELAYPROXY_STORE_CRASH_CHILD"

// crashBody is the body of the message with this id, so the parent can
// check it byte for byte.
func crashBody(id string) []byte {
	sum := sha256.Sum256([]byte(id))
	n := 50 + int(sum[0])*4
	return []byte(strings.Repeat(hex.EncodeToString(sum[:]), n/64+1)[:n])
}

// crashChild opens the store, then Puts messages from several goroutines
// forever, printing "id key" after each Put returned, until it is killed.
func crashChild() {
	path := os.Getenv(crashChildEnv)
	s, err := Open(path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	// The parent checks that the journal is replayed: a pause of the child
	// (a loaded machine) must not let an idle checkpoint empty it first.
	s.idleCheckpoint = 0
	ctx := context.Background()
	x := &store.ExchangeDef{VHost: "/", Name: "x", DelayedType: "direct"}
	if err := s.PutExchange(ctx, x); err != nil {
		fmt.Fprintln(os.Stderr, "child exchange:", err)
		os.Exit(2)
	}
	// Move the watermark part of the way so both slots and far buckets get
	// writes.
	if err := s.ScanKeys(0, base+3600_000, func(store.Key) error { return nil }); err != nil {
		fmt.Fprintln(os.Stderr, "child scan:", err)
		os.Exit(2)
	}
	pid := os.Getpid()
	var out sync.Mutex // one line per write(2)
	for g := range 8 {
		go func() {
			r := rand.New(rand.NewPCG(uint64(pid), uint64(g)))
			for i := 0; ; i++ {
				id := fmt.Sprintf("%d-%d-%d", pid, g, i)
				m := &store.Message{VHost: "/", Exchange: "x", Due: base + r.Int64N(24*3600_000),
					MessageID: id, Body: crashBody(id), Priority: uint8(r.IntN(3)), Incarnation: x.Incarnation}
				if err := s.Put(ctx, m); err != nil {
					fmt.Fprintln(os.Stderr, "child put:", err)
					os.Exit(2)
				}
				out.Lock()
				os.Stdout.WriteString(id + " " + hex.EncodeToString(m.Key[:]) + "\n")
				out.Unlock()
			}
		}()
	}
	select {}
}

func TestCrashKeepsConfirmedPuts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crash.db")
	confirmed := map[string]store.Key{}
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		read := func(line string) {
			id, k, ok := strings.Cut(line, " ")
			b, err := hex.DecodeString(k)
			if !ok || err != nil || len(b) != store.KeySize {
				t.Fatalf("child printed %q", line)
			}
			confirmed[id] = store.Key(b)
		}
		// Read a few thousand confirmations (a little while), then kill
		// the child in the middle of its stream.
		// Past checkpointAt, so that background checkpoints run too.
		want := len(confirmed) + 3000 + rand.IntN(3000)
		deadline := time.Now().Add(20 * time.Second)
		for len(confirmed) < want && time.Now().Before(deadline) && sc.Scan() {
			read(sc.Text())
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for sc.Scan() { // lines written before the kill
			if line := sc.Text(); strings.Contains(line, " ") {
				read(line)
			}
		}
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		if len(confirmed) < want {
			t.Fatalf("round %d: child confirmed only %d messages; stderr: %s", round, len(confirmed), stderr.String())
		}

		s, err := Open(path, Options{NoSync: true})
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		if err := s.Check(); err != nil {
			s.Close()
			t.Fatalf("round %d: Check after SIGKILL: %v", round, err)
		}
		keys := make([]store.Key, 0, len(confirmed))
		ids := make([]string, 0, len(confirmed))
		for id, k := range confirmed {
			ids = append(ids, id)
			keys = append(keys, k)
		}
		got, err := s.Get(keys)
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
		for i, m := range got {
			if m == nil {
				s.Close()
				t.Fatalf("round %d: confirmed message %s lost after SIGKILL", round, ids[i])
			}
			if m.MessageID != ids[i] || string(m.Body) != string(crashBody(ids[i])) {
				s.Close()
				t.Fatalf("round %d: message %s came back as %q with body %q", round, ids[i], m.MessageID, m.Body)
			}
		}
		if s.Stats().Checkpoints == 0 {
			t.Errorf("round %d: nothing replayed from the journal: the child's last Puts were all checkpointed", round)
		}
		if p := s.Pending(); p < int64(len(confirmed)) {
			t.Errorf("round %d: Pending %d < %d confirmed", round, p, len(confirmed))
		}
		t.Logf("round %d: %d confirmed messages intact, %d stored", round, len(confirmed), s.Pending())
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
