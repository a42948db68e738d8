package delayproxy

import (
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/intake"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/scheduler"
)

// releasesFirst is the intake gate of Config.ReleasesFirst (nil when it is
// off) and where it is wired: the scheduler's metrics tell it each
// release's lateness, and the delayed-exchange layer takes room in it
// before each Put.
type releasesFirst struct {
	gate *intake.Gate
}

func newReleasesFirst(target time.Duration, now func() time.Time) releasesFirst {
	if target <= 0 {
		return releasesFirst{}
	}
	return releasesFirst{gate: intake.New(target, now)}
}

// intake is the gate as the delayed-exchange layer takes it; nil (always
// open) when off.
func (r releasesFirst) intake() delayed.Intake {
	if r.gate == nil {
		return nil
	}
	return r.gate
}

// register adds the gate's window to m's gauges, when there is a gate.
func (r releasesFirst) register(m *metrics.Metrics) error {
	if r.gate == nil {
		return nil
	}
	return m.RegisterIntake(r.gate.Window)
}

// schedulerMetrics is m, with each release's lateness also told to the
// gate when there is one.
func (r releasesFirst) schedulerMetrics(m *metrics.Metrics) scheduler.Metrics {
	if r.gate == nil {
		return m
	}
	return observedMetrics{Metrics: m, gate: r.gate}
}

// observedMetrics is the scheduler's metrics with the gate observing
// release lateness.
type observedMetrics struct {
	*metrics.Metrics
	gate *intake.Gate
}

// ReleaseLateness records late and tells the gate.
func (o observedMetrics) ReleaseLateness(late time.Duration) {
	o.Metrics.ReleaseLateness(late)
	o.gate.Observe(late)
}
