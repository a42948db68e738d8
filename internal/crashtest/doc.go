// Package crashtest is the machinery of delayproxy's reliability, shutdown
// and load tests and benchmarks: clients that keep publishing through
// faults and keep an exact ledger of what the proxy confirmed (Publisher,
// run side by side as Publishers), the tally that checks the ledgers
// against what RabbitMQ delivered, a proxy run as a child process that can
// be signalled, killed and started again on the same data directory
// (Process, on a FreePort), a raw AMQP client for hostile input and idle
// connections, and process counters (goroutines, file descriptors, memory).
//
// The ledger is what the tests prove things with: a message-id is confirmed
// only when the client saw basic.ack for it. Invariant 1 (confirmed means
// fsync'd) and invariant 2 (deleted only after RabbitMQ confirmed the
// release) together say that every confirmed id is delivered at least once,
// whatever happened in between; Tally counts the lost ones (must be zero)
// and the duplicates (bounded by the releases in flight at each fault).
//
// Nothing here mocks RabbitMQ or the proxy: the clients are amqp091-go (or
// raw frames), the proxy is the real one, the broker the test broker.
package crashtest
