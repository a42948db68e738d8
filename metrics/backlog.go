package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Backlog is what the overdue gauges read; *scheduler.Scheduler has it. It
// must be cheap (it is called at every scrape) and safe for concurrent use.
type Backlog interface {
	// Overdue is the number of messages due and not yet released, and how
	// late the oldest of those waiting for release is (0 when none waits).
	Overdue() (messages int64, oldest time.Duration)
}

var (
	descOverdue = prometheus.NewDesc(namespace+"_overdue_messages",
		"Delayed messages past their due time and not yet released (a backlog after downtime, a burst, --release-rate, RabbitMQ unreachable); measured about once a second.",
		nil, nil)
	descOldestOverdue = prometheus.NewDesc(namespace+"_oldest_overdue_seconds",
		"How late the oldest overdue message waiting for release is; 0 when none waits.",
		nil, nil)
)

// RegisterBacklog adds the gauges delayproxy_overdue_messages and
// delayproxy_oldest_overdue_seconds, read from b at scrape time, and makes
// Snapshot report them. Call it once, before serving.
func (m *Metrics) RegisterBacklog(b Backlog) error {
	if err := m.reg.Register(backlogCollector{b}); err != nil {
		return err
	}
	m.backlog.Store(&b)
	return nil
}

// backlogCollector reads the backlog at scrape time.
type backlogCollector struct{ b Backlog }

func (c backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descOverdue
	ch <- descOldestOverdue
}

func (c backlogCollector) Collect(ch chan<- prometheus.Metric) {
	n, oldest := c.b.Overdue()
	ch <- prometheus.MustNewConstMetric(descOverdue, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descOldestOverdue, prometheus.GaugeValue, oldest.Seconds())
}
