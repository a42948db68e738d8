package metrics

import (
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/boltstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "delayproxy"

// Direction is the way a relayed frame travels.
type Direction uint8

// Directions of relayed traffic; the values index arrays in Metrics.
const (
	ClientToUpstream Direction = iota
	UpstreamToClient
	numDirections
)

// String is the value of the direction label.
func (d Direction) String() string {
	switch d {
	case ClientToUpstream:
		return "client_to_upstream"
	case UpstreamToClient:
		return "upstream_to_client"
	}
	return "unknown"
}

// RefuseReason says why a delayed publish was refused.
type RefuseReason uint8

// Reasons for refusing a delayed publish; the values index arrays in Metrics.
const (
	RefusedInvalidDelay RefuseReason = iota // x-delay is not a number (406)
	RefusedDelayTooLong                     // x-delay above --max-delay (406)
	RefusedTooLarge                         // body above --max-message-size (406)
	RefusedStoreError                       // the store could not take it (nack or channel error)
	RefusedForbidden                        // RabbitMQ refused the user write or topic permission (403)
	RefusedUpstream                         // the permission check failed otherwise (404, connection lost)
	numRefuseReasons
)

// String is the value of the reason label.
func (r RefuseReason) String() string {
	switch r {
	case RefusedInvalidDelay:
		return "invalid_delay"
	case RefusedDelayTooLong:
		return "delay_too_long"
	case RefusedTooLarge:
		return "too_large"
	case RefusedStoreError:
		return "store_error"
	case RefusedForbidden:
		return "forbidden"
	case RefusedUpstream:
		return "upstream_error"
	}
	return "unknown"
}

// Histogram buckets, in seconds or messages.
var (
	// LatenessBuckets: fine-grained from 0.5 ms to 10 s, then minutes and an
	// hour for backlogs after downtime.
	LatenessBuckets = []float64{
		0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
		1, 2, 5, 10, 30, 60, 300, 3600,
	}
	// CommitBuckets: one group commit including fsync.
	CommitBuckets = []float64{
		0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5,
	}
	// BatchBuckets: messages in one group commit.
	BatchBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
)

// Metrics is the set of delayproxy collectors. Its methods are safe for
// concurrent use; a nil *Metrics does nothing.
type Metrics struct {
	reg *prometheus.Registry

	clientConns prometheus.Gauge
	channels    prometheus.Gauge
	connOpened  prometheus.Counter
	connClosed  prometheus.Counter

	frames     [numDirections]prometheus.Counter
	bytes      [numDirections]prometheus.Counter
	acksFolded prometheus.Counter

	stored     prometheus.Counter
	released   prometheus.Counter
	cancelled  prometheus.Counter
	discarded  prometheus.Counter
	unroutable prometheus.Counter
	refused    [numRefuseReasons]prometheus.Counter

	lateness    prometheus.Histogram
	commitTime  prometheus.Histogram
	commitBatch prometheus.Histogram

	upstreamReconnects prometheus.Counter

	role        prometheus.Gauge   // releaser roles held (role.go)
	roleChanges prometheus.Counter // releaser roles taken or lost

	backlog atomic.Pointer[Backlog] // set by RegisterBacklog; nil before
}

// New builds the collectors and registers them, with the Go and process
// collectors, in a new registry.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: name, Help: help, Buckets: buckets,
			// Native histograms too, for scrapers that ask for them; the
			// classic buckets above stay for everyone else.
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour,
		})
	}

	m.clientConns = gauge("client_connections", "Client AMQP connections currently open.")
	m.channels = gauge("channels", "Client AMQP channels currently open.")
	m.connOpened = counter("connections_opened_total", "Client AMQP connections accepted.")
	m.connClosed = counter("connections_closed_total", "Client AMQP connections closed.")

	frames := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "relayed_frames_total",
		Help: "AMQP frames relayed unchanged between clients and RabbitMQ.",
	}, []string{"direction"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "relayed_bytes_total",
		Help: "Bytes of AMQP frames relayed unchanged between clients and RabbitMQ.",
	}, []string{"direction"})
	for d := Direction(0); d < numDirections; d++ {
		m.frames[d] = frames.WithLabelValues(d.String())
		m.bytes[d] = bytes.WithLabelValues(d.String())
	}

	m.acksFolded = counter("acks_folded_total",
		"Consumer acks sent to RabbitMQ inside the next ack on the same channel (multiple set), not on their own.")

	m.stored = counter("messages_stored_total", "Delayed messages stored durably (fsync'd) and confirmed to the publisher.")
	m.released = counter("messages_released_total", "Delayed messages published to RabbitMQ and confirmed by it.")
	m.cancelled = counter("messages_cancelled_total", "Delayed messages cancelled through the admin API.")
	m.discarded = counter("messages_discarded_total", "Delayed messages discarded because their exchange was deleted or re-created.")
	m.unroutable = counter("messages_unroutable_total", "Released mandatory messages that RabbitMQ returned as unroutable.")
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "messages_refused_total",
		Help: "Delayed publishes refused, by reason.",
	}, []string{"reason"})
	for r := RefuseReason(0); r < numRefuseReasons; r++ {
		m.refused[r] = refused.WithLabelValues(r.String())
	}

	m.lateness = histogram("release_lateness_seconds",
		"Time from a delayed message's due time to its release being published upstream.", LatenessBuckets)
	m.commitTime = histogram("store_commit_duration_seconds",
		"Duration of one store group commit, fsync included.", CommitBuckets)
	m.commitBatch = histogram("store_commit_batch_messages",
		"Messages written or deleted by one store group commit.", BatchBuckets)

	m.upstreamReconnects = counter("upstream_reconnects_total",
		"Times the releaser re-established its connection to RabbitMQ.")
	m.role = gauge("releaser_role",
		"Releaser roles this node holds: with the bbolt store 1, the whole store; in cluster mode the number of partitions of the messages (of 8) whose leases it holds and whose due messages it releases.")
	m.roleChanges = counter("releaser_role_changes_total",
		"Releaser roles (partitions, in cluster mode) this node took or lost.")

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.clientConns, m.channels, m.connOpened, m.connClosed,
		frames, bytes, m.acksFolded,
		m.stored, m.released, m.cancelled, m.discarded, m.unroutable, refused,
		m.lateness, m.commitTime, m.commitBatch,
		m.upstreamReconnects, m.role, m.roleChanges,
	)
	return m
}

// Registry is the registry holding every delayproxy collector.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:          m.reg, // counts its own scrape errors
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

// ConnOpened records an accepted client connection.
func (m *Metrics) ConnOpened() {
	if m == nil {
		return
	}
	m.connOpened.Inc()
	m.clientConns.Inc()
}

// ConnClosed records a closed client connection; call it once per ConnOpened.
func (m *Metrics) ConnClosed() {
	if m == nil {
		return
	}
	m.connClosed.Inc()
	m.clientConns.Dec()
}

// ChannelsOpened adds delta (negative when channels close) to the open
// channel gauge.
func (m *Metrics) ChannelsOpened(delta int) {
	if m == nil {
		return
	}
	m.channels.Add(float64(delta))
}

// Relayed records frames and bytes relayed from clients to RabbitMQ
// (toUpstream) or back. Call it once per write batch rather than per frame
// where the relay loop allows.
func (m *Metrics) Relayed(toUpstream bool, frames, bytes int) {
	if m == nil {
		return
	}
	d := UpstreamToClient
	if toUpstream {
		d = ClientToUpstream
	}
	m.frames[d].Add(float64(frames))
	m.bytes[d].Add(float64(bytes))
}

// AcksFolded records n consumer acks folded into the ack after them.
func (m *Metrics) AcksFolded(n int) {
	if m != nil {
		m.acksFolded.Add(float64(n))
	}
}

// Stored records n messages stored and confirmed.
func (m *Metrics) Stored(n int) {
	if m != nil && n > 0 {
		m.stored.Add(float64(n))
	}
}

// Released records n releases confirmed by RabbitMQ.
func (m *Metrics) Released(n int) {
	if m != nil && n > 0 {
		m.released.Add(float64(n))
	}
}

// Cancelled records n messages cancelled by an operator.
func (m *Metrics) Cancelled(n int) {
	if m != nil && n > 0 {
		m.cancelled.Add(float64(n))
	}
}

// Discarded records n messages dropped because their exchange went away.
func (m *Metrics) Discarded(n int) {
	if m != nil && n > 0 {
		m.discarded.Add(float64(n))
	}
}

// Unroutable records n released messages returned by RabbitMQ as unroutable.
func (m *Metrics) Unroutable(n int) {
	if m != nil && n > 0 {
		m.unroutable.Add(float64(n))
	}
}

// Refused records a refused delayed publish.
func (m *Metrics) Refused(r RefuseReason) {
	if m == nil || r >= numRefuseReasons {
		return
	}
	m.refused[r].Inc()
}

// PublishTooLarge records a delayed publish refused for a body above
// --max-message-size (reason too_large).
func (m *Metrics) PublishTooLarge() { m.Refused(RefusedTooLarge) }

// ReleaseLateness records how long after its due time a message was released.
func (m *Metrics) ReleaseLateness(late time.Duration) {
	if m == nil {
		return
	}
	m.lateness.Observe(late.Seconds())
}

// UpstreamReconnect records a reconnection of the releaser to RabbitMQ.
func (m *Metrics) UpstreamReconnect() {
	if m == nil {
		return
	}
	m.upstreamReconnects.Inc()
}

// Commit records one store group commit: *Metrics is a boltstore.Metrics.
// Failed commits are counted from Stats, not here.
func (m *Metrics) Commit(ci store.CommitInfo) {
	if m == nil || ci.Err != nil {
		return
	}
	m.commitTime.Observe(ci.Duration.Seconds())
	m.commitBatch.Observe(float64(ci.Messages + ci.Deletes))
}

// Store is what the scrape-time store collector reads; *boltstore.Store has it.
// Every method is cheap: in-memory counters or one cursor seek.
type Store interface {
	// Exchanges lists the registered delayed exchanges.
	Exchanges() []store.ExchangeDef
	// Count is the number of pending messages of one exchange, O(1).
	Count(vhost, exchange string) int64
	// NextDue is the earliest due time of any stored message.
	NextDue() (int64, bool)
	// Stats returns the cumulative counters of the store.
	Stats() boltstore.Stats
}

// RegisterStore adds collectors that read s at scrape time: pending messages
// per exchange, the earliest due time, the writer's totals, and the size of
// the file at path (skipped when path is ""). Call it once, after the store
// is open. A scrape costs O(delayed exchanges).
func (m *Metrics) RegisterStore(s Store, path string) error {
	return m.reg.Register(&storeCollector{s: s, path: path})
}

var (
	descPending = prometheus.NewDesc(namespace+"_pending_messages",
		"Delayed messages stored and not yet released, per delayed exchange.",
		[]string{"vhost", "exchange"}, nil)
	descNextDue = prometheus.NewDesc(namespace+"_next_due_timestamp_seconds",
		"Due time of the earliest stored message (absent when none); time() minus it, when positive, is how far release is behind.",
		nil, nil)
	descStale = prometheus.NewDesc(namespace+"_store_stale_messages",
		"Stored messages of deleted or cancelled exchanges, waiting to be discarded.", nil, nil)
	descCommits = prometheus.NewDesc(namespace+"_store_commits_total",
		"Group commits of the store.", nil, nil)
	descFailedCommits = prometheus.NewDesc(namespace+"_store_commit_failures_total",
		"Store group commits that failed.", nil, nil)
	descCommitSeconds = prometheus.NewDesc(namespace+"_store_commit_seconds_total",
		"Total time spent in store group commits, fsync included.", nil, nil)
	descWritten = prometheus.NewDesc(namespace+"_store_written_messages_total",
		"Messages written by the store.", nil, nil)
	descDeleted = prometheus.NewDesc(namespace+"_store_deleted_messages_total",
		"Messages removed from the store (released, cancelled or discarded).", nil, nil)
	descCascades = prometheus.NewDesc(namespace+"_store_cascades_total",
		"Passes that sorted far buckets into time slots.", nil, nil)
	descCascaded = prometheus.NewDesc(namespace+"_store_cascaded_messages_total",
		"Messages moved from far buckets into time slots.", nil, nil)
	descJournalCommits = prometheus.NewDesc(namespace+"_store_journal_commits_total",
		"Store group commits made durable by one append to the journal (the others are bbolt commits).", nil, nil)
	descCheckpoints = prometheus.NewDesc(namespace+"_store_checkpoints_total",
		"bbolt commits that took the journaled messages.", nil, nil)
	descFileBytes = prometheus.NewDesc(namespace+"_store_file_bytes",
		"Size of the store file; bbolt files never shrink.", nil, nil)
)

// storeCollector reads the store at scrape time.
type storeCollector struct {
	s    Store
	path string
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descPending, descNextDue, descStale, descCommits, descFailedCommits, descCommitSeconds,
		descWritten, descDeleted, descCascades, descCascaded, descJournalCommits, descCheckpoints, descFileBytes,
	} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, d := range c.s.Exchanges() {
		n := c.s.Count(d.VHost, d.Name)
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(n), d.VHost, d.Name)
	}
	if due, ok := c.s.NextDue(); ok {
		ch <- prometheus.MustNewConstMetric(descNextDue, prometheus.GaugeValue, float64(due)/1e3)
	}
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, float64(st.Stale))
	ch <- prometheus.MustNewConstMetric(descCommits, prometheus.CounterValue, float64(st.Commits))
	ch <- prometheus.MustNewConstMetric(descFailedCommits, prometheus.CounterValue, float64(st.FailedCommits))
	ch <- prometheus.MustNewConstMetric(descCommitSeconds, prometheus.CounterValue, st.CommitTime.Seconds())
	ch <- prometheus.MustNewConstMetric(descWritten, prometheus.CounterValue, float64(st.Messages))
	ch <- prometheus.MustNewConstMetric(descDeleted, prometheus.CounterValue, float64(st.Deletes))
	ch <- prometheus.MustNewConstMetric(descCascades, prometheus.CounterValue, float64(st.Cascades))
	ch <- prometheus.MustNewConstMetric(descCascaded, prometheus.CounterValue, float64(st.CascadedMessages))
	ch <- prometheus.MustNewConstMetric(descJournalCommits, prometheus.CounterValue, float64(st.JournalCommits))
	ch <- prometheus.MustNewConstMetric(descCheckpoints, prometheus.CounterValue, float64(st.Checkpoints))
	if c.path != "" {
		if fi, err := os.Stat(c.path); err == nil {
			ch <- prometheus.MustNewConstMetric(descFileBytes, prometheus.GaugeValue, float64(fi.Size()))
		} else {
			ch <- prometheus.NewInvalidMetric(descFileBytes, err)
		}
	}
}
