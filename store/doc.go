// Package store is the contract of the delay engine's durable half: the
// Store interface, the types it speaks (Key, Message, ExchangeDef,
// ExchangeCount, CommitInfo) and its sentinel errors. The delayed layer,
// the scheduler, the admin API and the metrics see a store only through
// it. store/boltstore implements it in one bbolt file, store/pgstore in a
// PostgreSQL database several nodes share (cluster mode); store/storetest
// is the conformance suite every implementation passes.
//
// # Invariants
//
// Every implementation keeps these; the numbers are the root package's
// invariants.
//
//   - A write returns nil only once it is durable; any error but the
//     context's means nothing of it was written (invariant 1).
//   - Key order is release order: due time, then higher priority, then
//     publish order (invariant 4). ScanKeys and List return keys in it.
//   - A message leaves only by Delete, which the scheduler calls once
//     RabbitMQ confirmed its release (invariant 2), or by a cancel.
//   - Every registered exchange has an incarnation, never reused. A
//     message is stored under its exchange's incarnation; deleting or
//     cancelling the exchange makes its messages stale at once, without a
//     scan, and a stale message is never released.
//   - Counts are exact: Pending, Count and Counts' Pending count each
//     pending message once, in O(1); Upcoming costs the span of due times,
//     not their number. Opening a store does not read its messages
//     (invariants 5 and 6).
//   - The wall clock is not the store's business: due times are taken as
//     given.
package store
