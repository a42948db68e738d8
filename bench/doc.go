// Package bench holds delayproxy's benchmarks: the timing wheel and
// scheduler, the store, and end-to-end load runs against a real RabbitMQ.
// Run them with
//
//	go test -run '^$' -bench . ./bench/...
//
// They report throughput and memory with b.ReportMetric; targets are in the
// benchmarks' doc comments, never in test assertions. Those that compare
// latencies or ratios within a run also report steal-%: the share of the
// machine's CPU time its hypervisor gave to others meanwhile, which tells a
// disturbed run from a quiet one on a virtual machine.
package bench
