// Package testload loads the Go runtime for tests and benchmarks of timing
// under load.
package testload

import (
	"sync"
	"sync/atomic"
)

// BusyRunQueues keeps the runtime's run queues from emptying until stop is
// called, which waits for its goroutines: pairs of goroutines hand a token
// back and forth with a few microseconds of work between hand-offs and no
// system call, so a processor always finds a goroutine to run and never
// polls the network.
func BusyRunQueues(pairs int) (stop func()) {
	var quit atomic.Bool
	var wg sync.WaitGroup
	for range pairs {
		ping, pong := make(chan uint64), make(chan uint64)
		wg.Go(func() {
			defer close(ping)
			for v := uint64(1); !quit.Load(); {
				ping <- work(v)
				v = <-pong
			}
		})
		wg.Go(func() {
			for v := range ping {
				pong <- work(v)
			}
		})
	}
	return func() {
		quit.Store(true)
		wg.Wait()
	}
}

// work is a few microseconds of arithmetic on v.
func work(v uint64) uint64 {
	for range 5000 {
		v = v*6364136223846793005 + 1442695040888963407
	}
	return v
}
