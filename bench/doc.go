// Package bench holds delayproxy's benchmarks: the timing wheel and
// scheduler, the store, and end-to-end load runs against a real RabbitMQ.
// Run them with
//
//	go test -run '^$' -bench . ./bench/...
//
// They report throughput and memory with b.ReportMetric; targets are in the
// benchmarks' doc comments, never in test assertions.
package bench
