package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Snapshot is the value of the proxy's own counters and gauges at one
// instant, as /metrics would show them; the status page keeps a few
// minutes of them to show rates and release lateness. Counters only grow,
// so the difference of two snapshots is what happened between them.
type Snapshot struct {
	Stored, Released, Refused        float64 // counters: messages
	Discarded, Cancelled, Unroutable float64 // counters: messages
	UpstreamReconnects               float64 // counter
	ClientConnections, Channels      float64 // gauges
	Overdue                          int64   // RegisterBacklog's gauge; 0 without one
	OldestOverdue                    time.Duration
	Lateness                         Histogram // release lateness, seconds
}

// Histogram is a cumulative histogram: Counts[i] observations were at most
// Bounds[i]; Count is all of them, the last ones above every bound.
type Histogram struct {
	Bounds []float64 // upper bounds, ascending
	Counts []uint64  // cumulative, one per bound
	Count  uint64
	Sum    float64
}

// Snapshot reads every counter and gauge of the status page: O(histogram
// buckets), no store access.
func (m *Metrics) Snapshot() Snapshot {
	s := Snapshot{
		Stored:             counterValue(m.stored),
		Released:           counterValue(m.released),
		Discarded:          counterValue(m.discarded),
		Cancelled:          counterValue(m.cancelled),
		Unroutable:         counterValue(m.unroutable),
		UpstreamReconnects: counterValue(m.upstreamReconnects),
		ClientConnections:  gaugeValue(m.clientConns),
		Channels:           gaugeValue(m.channels),
	}
	for _, c := range m.refused {
		s.Refused += counterValue(c)
	}
	if b := m.backlog.Load(); b != nil {
		s.Overdue, s.OldestOverdue = (*b).Overdue()
	}
	var d dto.Metric
	if m.lateness.Write(&d) == nil {
		h := d.GetHistogram()
		s.Lateness.Count, s.Lateness.Sum = h.GetSampleCount(), h.GetSampleSum()
		for _, b := range h.GetBucket() {
			s.Lateness.Bounds = append(s.Lateness.Bounds, b.GetUpperBound())
			s.Lateness.Counts = append(s.Lateness.Counts, b.GetCumulativeCount())
		}
	}
	return s
}

func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if c.Write(&d) != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}

func gaugeValue(g prometheus.Gauge) float64 {
	var d dto.Metric
	if g.Write(&d) != nil {
		return 0
	}
	return d.GetGauge().GetValue()
}

// Sub is the observations of h that prev, an earlier reading of the same
// histogram, did not have.
func (h Histogram) Sub(prev Histogram) Histogram {
	out := Histogram{Bounds: h.Bounds, Counts: make([]uint64, len(h.Counts)), Count: h.Count, Sum: h.Sum - prev.Sum}
	copy(out.Counts, h.Counts)
	if len(prev.Counts) == len(h.Counts) {
		for i, c := range prev.Counts {
			out.Counts[i] -= min(c, out.Counts[i])
		}
		out.Count -= min(prev.Count, out.Count)
	}
	return out
}

// Quantile estimates the q-quantile (0 <= q <= 1) of the observations as
// Prometheus's histogram_quantile does: linearly within the bucket it falls
// in, the first bucket starting at 0, and the highest bound when it falls
// above every bound. false when the histogram is empty.
func (h Histogram) Quantile(q float64) (float64, bool) {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0, false
	}
	rank := q * float64(h.Count)
	var below uint64 // observations in the buckets before i
	for i, c := range h.Counts {
		if float64(c) >= rank && c > below {
			lo := 0.0
			if i > 0 {
				lo = h.Bounds[i-1]
			}
			return lo + (h.Bounds[i]-lo)*(rank-float64(below))/float64(c-below), true
		}
		below = c
	}
	return h.Bounds[len(h.Bounds)-1], true
}
