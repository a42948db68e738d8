// Package boltstore is the embedded implementation of the store contract
// (package store): delayed messages in one bbolt file laid out as a timing
// wheel on disk, with the registry of delayed exchanges, a message-id index,
// exact counters and a tally of due times, and a journal beside it (paths
// "-journal0" and "-journal1") that takes groups of Puts ahead of bbolt.
// Open, Options, Stats and Check are its own; everything else is
// store.Store.
//
// # Invariants
//
// The numbers are the root package's invariants.
//
//   - Put returns nil only once its messages are durable: in a journal
//     record that was fdatasync'd, or in a bbolt commit that was; a failed
//     append or commit fails every request in it (invariant 1).
//   - A stored message is in the journal or in bbolt, and readers find it
//     in either: a checkpoint writes journaled messages into bbolt and
//     moves the journal past their generation in one transaction; every
//     other bbolt write comes after the journaled messages it may touch
//     (its commit checkpoints first); Open replays the journal before it
//     returns.
//   - Keys come out in release order (invariant 4) although every bucket
//     is appended to in publish order: readers sort one slot at a time.
//   - Memory holds no message beyond the one slot being read and the
//     journaled ones (invariant 5): two generations of at most 16,384
//     messages and 8 MiB each, whatever the pending count. What grows is
//     the tally, one 480-byte row per hour of due times that holds a
//     message, not per message.
//   - Open reads metadata, the registry, the counters, the tally and the
//     journal, never bbolt's messages (invariant 6), except once, when it
//     upgrades an older schema.
//   - Counters and tally change in the transaction that changes what they
//     count, and Check proves them against the messages.
//   - The ids index holds an entry for every pending message with a
//     message-id, and the entries of messages taken out that wait in the
//     ids-gone list (idsgone.go), never more than 65,536 after a commit: a
//     removal appends there in its own commit instead of rewriting a page
//     of the index, and the writer deletes them when idle. Check proves
//     both kinds.
//   - A slot loses messages only whole: a released mark is only made for a
//     message of its slot, and a slot is dropped only when every message in
//     it is marked.
//   - One writer goroutine owns every write transaction, but for a
//     background checkpoint's, during which it lends the checkpoint its
//     state and only appends to the journal.
//
// # Layout
//
// The cascade watermark W splits the messages: those due before W sit in
// the slot of their due time (Options.SlotWidth, 1 s), those due at or
// after W in the far bucket of their due time (Options.FarWidth, a day).
// Both are keyed sequence first, so that a commit appends to the buckets it
// touches. A ScanKeys that reaches past W first runs a cascade pass
// (cascade.go): it moves the far messages of the next stretch into slots
// and moves W. A released message in a slot is marked in the slot's
// released bucket instead of deleted in place, and the slot goes whole
// once all of it is marked. Buckets and keys: schema.go; values: codec.go;
// the tally: tally.go; the reasons and the figures: docs/store.md.
//
// # Group commit
//
// The writer goroutine takes the first queued request, then every request
// that queued up meanwhile (up to Options.MaxBatch messages, yielding the
// processor once when the queue runs dry, as long as yielding brings new
// requests; never sleeping), and commits them together. Each caller waits
// for the commit holding its request only. A cascade pass's move,
// NextDue's far scan (when every message lies beyond W) and Check run
// between commits in the same goroutine.
//
// # Journal
//
// A group of Puts alone is committed to the journal (journal.go): one
// record, one fdatasync, against bbolt's two fdatasyncs and some twenty
// pages at random places. Its messages then join the overlays
// (overlay.go), through which Get, the counts, NextDue and Upcoming see
// them. Once a generation holds 12,288 messages, the writer freezes it and
// a goroutine of its own writes it into bbolt (checkpoint.go) while the
// journal takes the next generation; until that checkpoint ends, the
// writer does nothing but append, since the checkpoint uses its state. A
// generation left without a request for 50 ms is checkpointed in the
// background as well; with nothing journaled, such a pause lets the writer
// delete a chunk of the ids entries waiting (idsgone.go) instead.
// Any other write, Check, Close and a read that walks bbolt (ScanKeys,
// List, Counts' due times) wait for it and checkpoint what is left in the
// same goroutine, with their own commit. When bbolt has no room for the
// journaled messages (ErrFull) they stay journaled: only the requests that
// touch none of them are committed, so that deletes can still make room,
// and the journal takes nothing more until a checkpoint succeeds.
//
// # bbolt settings
//
// The freelist is a hashmap and is not written at commit (NoFreelistSync)
// unless Options.SyncFreelist; Close writes it once, so a clean reopen
// loads it, while after a crash bbolt rebuilds it by walking every page.
// InitialMmapSize defaults to 1 GiB so that the file grows without
// remapping under readers.
package boltstore
