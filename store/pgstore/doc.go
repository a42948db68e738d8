// Package pgstore is the store contract (package store) on a PostgreSQL
// database that several delayproxy nodes share: cluster mode. Every node
// takes delayed publishes into it; the node that holds the releaser role
// of a message's partition (a lease, elsewhere) loads, releases and
// deletes it. Open, Options, Stats, Check, CheckSchema, View and the
// partitions are its own; everything else is store.Store.
//
// # Tables
//
// All in one schema (Options.Schema, default "delayproxy"), created and
// migrated by Open under an advisory lock; schema_version holds the
// version, and a version newer than this code's is refused.
//
//	exchanges   (vhost, name) PK, kind, delayed_type, durable, auto_delete,
//	            internal, arguments, incarnation UNIQUE <- sequence incarnations
//	messages    (part, k) PK: part = incarnation % 8, the partition;
//	            k bytea = store.Key (due ms BE | 255-prio | seq BE), whose
//	            byte order is release order and whose seq % 8 is part
//	            (schema version 3); incarnation, vhost, exchange,
//	            routing_key, mandatory, properties, body, delay, priority,
//	            message_id
//	              PK (part, k)                    Get, Delete, CancelKey by
//	                                              key; ScanKeys, NextDue (a
//	                                              Merge Append of partitions)
//	              index (incarnation, k)          List, Counts' NextDue
//	              index (vhost, exchange, message_id) WHERE message_id <> ''   Cancel
//	counts      (incarnation, shard) PK, n      stored messages per incarnation
//	tally       (minute, shard) PK, n           stored messages per due minute;
//	            shard = partition * 16 + the committer's shard (version 2)
//	message_seq sequence, INCREMENT BY 1024     a node takes 1024 counters per
//	                                            nextval; a key's seq is
//	                                            counter * 8 + partition
//
// # Invariants
//
//   - A write returns nil only after the transaction holding it has
//     committed (durable as the server's synchronous_commit and standbys
//     make it); a failed commit fails every request in it (invariant 1).
//   - Counts and tally change in the transaction that changes what they
//     count. Each committer writes its own shard row (of 16) per
//     incarnation and per minute, so that commits of different nodes and
//     connections never wait on each other's row locks; readers sum the
//     shards: Pending, Count and Counts read a few rows per exchange,
//     never the messages; Check proves the sums against the messages.
//   - Pending is the sum over live incarnations (those in exchanges), the
//     stale count the sum over the others: CancelExchange and
//     DeleteExchange make messages stale in O(1), as in boltstore.
//   - A Put checks its incarnations against exchanges inside its
//     transaction, so a node whose registry cache is behind cannot store
//     under a dead incarnation; a delete racing it may still leave the
//     message stored stale, which the contract allows.
//   - Sequences: the writer goroutine hands out counters in queue order
//     from blocks of 1024 it reserves, so a Put that returned orders
//     before any Put called after it on the same node. A key's sequence
//     is counter * 8 + its message's partition, so a key alone says the
//     row's part: a lookup by key is one probe of the primary key. Across nodes keys are
//     unique but "later" means nothing finer than the due millisecond and
//     priority: two nodes' messages with equal due time and priority are
//     released in an order that need not be publish order.
//   - Open reads the registry and nothing else (invariant 6); memory holds
//     the registry only (invariant 5).
//
// # Partitions
//
// The messages are divided into Partitions (8) partitions by their
// exchange's incarnation (PartitionOf: incarnation % 8), so that all the
// messages of one exchange are in one partition. The releaser role is
// held per partition (package lease); the node holding a set of
// partitions runs its Scheduler on View(set): the store whose ScanKeys,
// NextDue, Upcoming and Get see only those partitions. The primary key
// leads with the partition: a scan reads one range of it per partition,
// merged in key order (Merge Append, each range read only as far as the
// merge takes it), never a scan of the table. The admin API reads the
// whole store, all eight partitions merged the same way.
//
// # Group commit
//
// One writer goroutine takes the first queued request (Put, Delete,
// Cancel, CancelKey) and every request that queued meanwhile, up to
// Options.MaxBatch, sets the Put keys and hands the batch to the first
// free of Options.Committers committer goroutines; while all are busy,
// requests queue for the next batch. No linger: a batch leaves as soon as
// a committer is free. A committer runs the batch in one transaction:
// the cancels, the deletes (one DELETE ... = ANY), the incarnation check,
// one binary COPY of every message (copyrows.go), then the count and
// tally upserts and the notification, pipelined, and COMMIT. A batch of
// Puts only takes two round trips: BEGIN with the COPY, then the check,
// counts, tally, notification and COMMIT. Deadlocks and serialization
// failures are retried.
//
// # Notifications
//
// A Put announces, in its transaction (delivered at commit), the keys of
// its messages due within Options.NotifyWithin, each with its partition
// ("node p.key p.key ..."), on channel <schema>_keys; registry changes
// notify <schema>_registry. Each store listens on its own connection:
// registry notifications reload the cache, keys go to Options.OnNotify
// (the scheduler of the node holding their partition). The listener
// reloads the registry every Options.ReloadInterval and after a
// reconnect, and then
// calls Options.OnMissed (the scheduler rescans its horizon), the
// backstops of a notification missed.
//
// # Zero loss on a primary failure
//
// A commit is as durable as the server makes it: with synchronous_commit
// = on and a synchronous standby (synchronous_standby_names), a confirmed
// message survives the loss of the primary; with an asynchronous standby,
// the transactions not yet replicated when the primary dies are lost
// although their messages were confirmed. synchronous_commit = off or
// fsync = off lose confirmed messages on a crash of the server itself.
package pgstore
