// Package store keeps delayed messages durably in one bbolt file: a timing
// wheel on disk, the registry of delayed exchanges, a message-id index and
// exact counters. It is the durable half of the delay engine; the scheduler
// loads what comes due from it into its in-memory wheel.
//
// # Invariants
//
//   - Put returns nil only after the commit holding its messages is
//     fsync'd. A failed commit fails every request in it; nothing is dropped
//     silently.
//   - Key order is release order: due time, then higher priority, then
//     publish order (a store-wide sequence). Scan, ScanKeys and List return
//     keys in that order.
//   - Open reads metadata and the registry only, never messages, and memory
//     does not grow with the number of pending messages.
//   - Counters are exact: every stored message counts once, under the
//     exchange incarnation it was stored with, and Check proves it.
//   - A released mark is only ever made for a message of its slot, and a
//     slot loses messages only whole: a slot is dropped only when every
//     message in it is marked (equal counts prove it), so no pending
//     message leaves with a slot.
//   - The wall clock is not the store's business: due times are taken as
//     given.
//
// # Layout
//
// Top-level buckets:
//
//	slots      slot index (due / SlotWidth, 8 B BE) -> nested bucket:
//	               stored key (17 B) -> encoded message   messages due before W
//	far        far index (due / FarWidth, 8 B BE) -> nested bucket:
//	               stored key (17 B) -> encoded message   messages due at or after W
//	released   slot index (8 B BE) -> nested bucket:
//	               Key (17 B) -> 0x01                     released messages of that slot
//	ids        uvarint len, vhost, uvarint len, exchange,
//	           uvarint len, message-id, Key -> (empty)    only pending messages with a message-id
//	exchanges  uvarint len, vhost, name -> encoded ExchangeDef
//	meta       magic, version, slot-ms, far-ms, seq (next sequence),
//	           incarnation (last one handed out), watermark (ms),
//	           counts: nested bucket incarnation (8 B BE) -> stored messages (8 B BE)
//
// The schema version is 2. Version 1 had no released bucket (it deleted
// released messages in place); Open upgrades such a file by adding it.
//
// A message is stored under its Key reordered sequence first, so that
// every bucket is appended to in publish order:
//
//	stored key:  0              8              16     17
//	             +--------------+--------------+------+
//	             | sequence BE  | due ms BE    | 255- |
//	             |              |              | prio |
//	             +--------------+--------------+------+
//
// The cascade watermark W (a slot boundary, persisted in meta) splits the
// messages: those due before W sit in the slot of their due time (1 s
// wide); those due at or after W in the far bucket of their due time (a
// day wide). Readers sort one slot at a time in memory (Scan, ScanKeys,
// NextDue, List), so memory is bounded by what is due within one slot
// width, never by the pending count.
//
// Why: random due times make every Put land in a random place, and a B+tree
// insert at a random place dirties a 4 KiB page of its own, written and
// fsync'd at the commit: with hundreds of messages per commit, hundreds of
// pages (plain bbolt with random keys manages ~14k inserts/s at 5M keys).
// Keyed by due time inside a slot, the same happens within every slot.
// Appending instead dirties only the last page of each bucket a commit
// touches: delays spread over a day touch one or two far buckets, delays
// within the next minute a few dozen slots.
//
// When a Scan or ScanKeys asks for messages due at or after W, a cascade
// pass runs: a goroutine scans the far bucket at W (keys only, on a read
// transaction, while commits go on; far Puts committed into the range
// meanwhile are noted by the writer), then the writer moves the messages due
// in the next stretch (up to Options.CascadeLead past the request, at most
// 100k per pass) into fresh slots, in sequence order so that slots are built
// by appending too, and moves W, in one short transaction. A far bucket is
// deleted once W passes its end; until then its entries below W are shadow
// copies that every reader ignores.
//
// Released messages leave through Delete. A message in a slot is not
// deleted in place but marked: its Key goes into the slot's released
// bucket, in release order, so a mark appends. Deleting in place rewrote
// nearly every page of the slot at each commit, since release order (due
// time) is not the slot's order (sequence): at 10,000 releases/s a commit
// of 2,000 deletes took 20-30 ms of CPU and stalled RabbitMQ on a shared
// machine. Every reader leaves marked messages out (Get, Scan, ScanKeys,
// List, Counts, NextDue, the cancels), and the counts and the ids index
// drop them in the commit that marks them. Once every message of a slot is
// marked, the commit drops the slot and its released bucket with one
// DeleteBucket each. A message in a far bucket (cancelled before its
// cascade) is deleted in place.
//
// # Message encoding (version 1)
//
// Due time and priority live in the key. The value:
//
//	 0     1       2                  10
//	+-----+-------+------------------+-----------+
//	| ver | flags | incarnation BE   | delay     |  flags: 1 mandatory,
//	| =1  |       | (8 B)            | (varint)  |         2 has message-id
//	+-----+-------+------------------+-----------+
//	| uvarint len + vhost            |
//	| uvarint len + exchange         |
//	| uvarint len + routing key      |
//	| uvarint len + message-id       |
//	| uvarint len + properties       |  raw content-header property flags
//	|                                |  and list, byte-exact
//	| body (rest of the value)       |
//	+--------------------------------+
//
// An exchange definition: ver (1), flags (1: durable, 2: auto-delete,
// 4: internal), incarnation (8 B BE), uvarint len + x-delayed-type, then the
// raw argument table as the rest of the value.
//
// # Incarnations and counts
//
// Every registered exchange has an incarnation, a number from a store-wide
// counter. A message records the incarnation of its exchange at Put.
// CancelExchange gives the exchange a new incarnation and DeleteExchange
// removes it: in both cases the old messages become stale in O(1), without
// a scan, and the scheduler deletes them instead of releasing them (Stale).
// Counts are kept per incarnation, in memory and in meta within the same
// transaction as the change, so deleting a stale message later decrements
// the stale incarnation, never the live one. Pending is the sum over live
// incarnations; Stats().Stale the sum over the others.
//
// # Group commit
//
// One writer goroutine owns every write transaction. It takes the first
// queued request, then every request that queued up meanwhile (up to
// Options.MaxBatch messages, yielding the processor once when the queue runs
// dry, as long as yielding brings new requests; never sleeping), applies
// them in one transaction and commits. Each caller waits for the commit
// holding its request only. The short write of a cascade pass, NextDue's
// far scan (when every message lies beyond W) and Check run between commits
// in the same goroutine.
//
// # bbolt settings
//
// The freelist is a hashmap (O(1) allocation on big files) and is not
// written at commit (NoFreelistSync) unless Options.SyncFreelist; Close
// writes it once. After a clean Close, Open loads it and takes milliseconds
// whatever the size; after a crash bbolt rebuilds it by walking every page
// (about 1.7 s for 5M messages, an 800 MB file, warm cache). SyncFreelist
// makes every Open fast at the price of writing (and sorting) the whole
// freelist at every commit, which grows with free pages once a backlog has
// drained. InitialMmapSize defaults to 1 GiB so the file grows without
// remapping under readers.
package boltstore
