// Package metrics holds delayproxy's Prometheus collectors.
//
// Everything lives in one private *prometheus.Registry (never the global
// one), together with the Go runtime and process collectors, so that tests
// and embedders can run several proxies in one process.
//
// Names follow Prometheus conventions: the delayproxy_ prefix, counters end
// in _total, durations are _seconds, sizes _bytes.
//
// Invariants:
//   - The hot path never looks up a label: labelled series are curried once
//     in New and kept in arrays indexed by small enums (Direction,
//     RefuseReason). Every method is a handful of atomic adds.
//   - A nil *Metrics is valid and does nothing, so packages under test can
//     run without metrics.
//   - Pending counts are not mirrored into gauges; they are read from the
//     store at scrape time (O(delayed exchanges)), so they can never drift.
//   - The overdue gauges are read at scrape time from the scheduler's last
//     measure of its backlog (RegisterBacklog), O(1).
//   - Snapshot reads the same collectors for the status page, O(buckets):
//     the page shows what /metrics shows.
package metrics
