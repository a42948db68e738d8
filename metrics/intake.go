package metrics

import "github.com/prometheus/client_golang/prometheus"

// RegisterIntake adds the gauge delayproxy_intake_window_messages, read
// from window at scrape time: how many delayed publishes releases first
// (package intake) lets into the store at once. Call it once, before
// serving, and only when releases first is on.
func (m *Metrics) RegisterIntake(window func() int) error {
	return m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "intake_window_messages",
		Help:      "Delayed publishes let into the store at once while releases run late (releases first); 1048576 when nothing is held back.",
	}, func() float64 { return float64(window()) }))
}
