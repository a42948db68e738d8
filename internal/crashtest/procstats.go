package crashtest

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// FDs is the number of file descriptors this process has open.
func FDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory being read
}

// RSS is this process's resident set size in bytes (VmRSS).
func RSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return -1
			}
			return kb << 10
		}
	}
	return -1
}

// Mem is the Go memory in use after a GC: heap objects plus goroutine
// stacks (each goroutine's stack is not heap).
func Mem() (heapInuse, stackInuse uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.StackInuse
}

// LiveHeap is the Go heap allocated and still reachable after a GC, in
// bytes: finer than Mem's heap in use, which counts whole spans.
func LiveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// FloorRSS is RSS after a collection that returns all free memory to the
// OS, so that two readings differ by what is in use, not by what the
// scavenger happened to give back in between.
func FloorRSS() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	return RSS()
}

// Settle polls until f() <= want, for at most d, and returns the last
// value of f. Goroutines and sockets of closed connections take a moment
// to end.
func Settle(d time.Duration, want int, f func() int) int {
	deadline := time.Now().Add(d)
	for {
		n := f()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Steady returns f() once it has not changed for three reads 100 ms apart
// (at most 10 s), as a baseline.
func Steady(f func() int) int {
	last, same := f(), 0
	for i := 0; i < 100 && same < 3; i++ {
		time.Sleep(100 * time.Millisecond)
		n := f()
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// Goroutines is a dump of every goroutine's stack, grouped, for a failure
// message.
func Goroutines() string {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 1)
	return b.String()
}

// OpenFDs lists this process's open file descriptors and their targets, for
// a failure message.
func OpenFDs() string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		fmt.Fprintf(&b, "%s -> %s\n", e.Name(), target)
	}
	return b.String()
}
