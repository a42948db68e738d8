// Package scheduler releases delayed messages from the store to RabbitMQ at
// their due time, never early.
//
// Wheel is a plain data structure (no goroutines, no locks, the time passed
// in) holding the keys of the messages due within the near horizon.
// Scheduler is the loop that owns a Wheel, feeds it from a Store as the
// horizon advances (the loader), and hands due messages to a Releaser
// through a release pipeline, then deletes what RabbitMQ confirmed. The
// store is the truth: the scheduler holds keys, never messages, and reads
// each message from the store when it releases it (with ReadAhead, that
// long before its due time, keeping at most what falls due within it).
//
// Run releases until its context ends. Added (after a Put) and Cancelled
// (after a delete) tell a running scheduler what changed; they never block
// on it. Due times are wall-clock unix milliseconds of the injected Clock,
// since they must survive restarts.
//
// # Invariants
//
// The scheduler keeps these of the root package's invariants (package
// delayproxy):
//
//   - Never early (invariant 3): a message goes to the Releaser only once
//     the clock's wall time has reached its due millisecond. Timers decide
//     when the loop looks, never what it releases. If the wall clock goes
//     back, nothing is released until it reaches each due time again.
//   - Release order (invariant 4): among the messages that are due, the
//     highest priority first, then the earliest due, then publish order.
//     When releases keep up, each message goes at its due millisecond, so
//     this orders the messages of one millisecond; when they are behind (a
//     burst, a backlog after downtime, Rate, the retry backoff), it orders
//     everything due that the scheduler has loaded. The loader reads a
//     backlog oldest first, in windows (invariant 6), so after a downtime
//     longer than the horizon the first releases are the best of the oldest
//     window. A message whose release was not confirmed goes back among the
//     due ones, first of its priority, and all releases pause for the retry
//     backoff, so later messages of its priority do not overtake it. A
//     batch refused before it was written (its read failed, the
//     PipelinedReleaser refused it) takes back with it the batches
//     dispatched before the loop had it back, unwritten. Once a batch is
//     written, the order of overlapping batches is up to the Releaser.
//   - Deleted only after the confirm (invariant 2): a message leaves the
//     store only once RabbitMQ confirmed its release, or when it is stale
//     (its exchange was deleted or re-created: deleted, never released).
//     Duplicates after a crash are bounded by 5×MaxInFlight (MaxInFlight in
//     release, 4×MaxInFlight awaiting their delete). Run returns after
//     every release it started has returned and every confirmed message is
//     deleted.
//   - Memory (invariant 5) does not depend on the number of pending
//     messages: the wheel's slot table (24 bytes per slot: 1.5 MiB for the
//     default minute), at most MaxLoaded keys, the inbox of Added and
//     Cancelled, and at most 5×MaxInFlight keys out for release or delete.
//   - Restart (invariant 6): the first load starts at the store's NextDue
//     and asks for a short window first, so the first release after a long
//     downtime does not wait for the whole backlog.
//
// Every goroutine (the release pipeline, plain Release calls, the delete) is
// tracked and Run waits for it.
//
// DeleteExchange removes a delayed exchange from the store for the delayed
// layer and counts what it discarded: the messages still pending, never a
// release RabbitMQ confirmed, even one whose delete lingers or that was in
// flight (every message is counted once, released or discarded).
//
// The files follow the parts: wheel.go and due.go (the Wheel and its queues
// of due keys), clock.go, loop.go (Run), inbox.go (Added, Cancelled),
// load.go (the horizon loader), release.go (the release pipeline),
// readahead.go (reading messages before they are due, for a remote store),
// wheelpeek.go (the wheel's look ahead for it),
// delete.go (deletes of released messages), exchange.go (DeleteExchange), progress.go (the backlog's
// measure for Overdue, and progress lines while releases are behind).
// Design notes and measurements are in docs/scheduler.md.
package scheduler
