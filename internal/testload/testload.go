// Package testload loads the Go runtime for tests and benchmarks of timing
// under load, and measures how late a timer wakes its owner.
package testload

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Oversleeps sleeps n times with until, each time to a deadline drawn at
// random up to spread ahead, and returns how long after each deadline
// until returned. until sleeps to the deadline and returns the time its
// timer fired; one that fired before the deadline is an error.
func Oversleeps(n int, spread time.Duration, until func(deadline time.Time) (fired time.Time)) ([]time.Duration, error) {
	late := make([]time.Duration, n)
	for i := range late {
		deadline := time.Now().Add(rand.N(spread))
		if fired := until(deadline); fired.Before(deadline) {
			return nil, fmt.Errorf("fired %v early", deadline.Sub(fired))
		}
		late[i] = time.Since(deadline)
	}
	return late, nil
}

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
