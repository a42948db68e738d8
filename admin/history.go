package admin

import (
	"context"
	"sync"
	"time"

	"github.com/delayproxy/delayproxy/metrics"
)

// The status history: every statusEvery, one goroutine (started by Start,
// stopped and waited for by Shutdown) reads a snapshot of the process's own
// metrics into a ring of the last statusKeep, from which GET /api/status
// computes rates and release lateness over the last minutes. A snapshot is
// a few dozen numbers: the ring is a few tens of KiB, whatever the load.

const (
	statusEvery = 5 * time.Second
	statusKeep  = 61 // samples: 60 intervals, 5 minutes
)

// sample is one snapshot of the metrics and when it was read.
type sample struct {
	at   time.Time
	snap metrics.Snapshot
}

// history is the ring of the last statusKeep samples.
type history struct {
	mu      sync.Mutex // guards samples
	samples []sample   // oldest first
}

// add appends a sample, dropping the oldest beyond statusKeep.
func (h *history) add(s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.samples) == statusKeep {
		copy(h.samples, h.samples[1:])
		h.samples = h.samples[:statusKeep-1]
	}
	h.samples = append(h.samples, s)
}

// all is a copy of the samples, oldest first.
func (h *history) all() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sample(nil), h.samples...)
}

// sampleLoop samples the metrics now and every statusEvery until ctx ends.
func (s *Server) sampleLoop(ctx context.Context) {
	s.record()
	t := time.NewTicker(statusEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.record()
		}
	}
}

// record adds a snapshot of the metrics to the history.
func (s *Server) record() {
	s.hist.add(sample{at: s.now(), snap: s.opts.Metrics.Snapshot()})
}
