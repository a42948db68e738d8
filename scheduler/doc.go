// Package scheduler releases delayed messages at their due time, never early.
//
// It has two parts. Wheel is a plain data structure (no goroutines, no locks,
// the time passed in) holding the keys of the messages due within the near
// horizon. Scheduler is the loop that owns a Wheel, feeds it from the store
// as the horizon advances, and hands due messages to a Releaser.
//
// # The wheel
//
// A hashed timing wheel with one slot per millisecond over Span() slots (a
// power of two, at least the horizon plus 64), times in unix milliseconds,
// and one level of 64 ms buckets in front of the slots:
//
//	due <= Now()               over: sorted slice, returned first by Expire
//	Now() < due < open         slots[due & (Span-1)]: sorted slice of keys
//	open <= due <= Horizon()   stage[(due>>6) & (Span/64-1)]: unsorted keys
//	due > Horizon()            refused by Add (the caller keeps it on disk)
//
//	occ:  1 bit per slot, set when the slot is not empty (Span/64 words;
//	      word b covers the 64 slots of bucket b)
//	sum:  1 bit per occ word, set when that word is not zero
//	socc: 1 bit per bucket, set when its stage is not empty
//
// Within the horizon every slot and every bucket stands for exactly one time
// (Horizon stops one bucket short of wrapping onto the current one), so no
// entry carries a round count. Add appends a key due beyond open to the
// stage of its bucket; when Expire or Next reaches the first staged bucket,
// its keys are sorted into their slots and open moves to the bucket's end.
// Keys due before open go straight into their slot. This is what a
// hierarchical wheel's cascade does, with one level and a 64 ms bucket: keys
// published with random delays are appended to a few hundred bucket tails
// that stay in the CPU cache, instead of each landing in a random slot of a
// 1.5 MiB slot table (measured: twice the throughput of inserting each key
// straight into its slot; see BenchmarkWheel_AddExpire). A second level is
// not needed: the horizon is short (a minute by default) and the store, a
// wheel on disk, holds everything later.
//
// Next finds the first non-empty slot by scanning at most Span/4096 summary
// words plus two occupancy words (sorting in the first staged bucket if no
// slot is occupied), so a driver arms one timer to exactly the next due time
// and never ticks through empty milliseconds.
//
// Entries are store.Key values (17 bytes: due, 255-priority, sequence), not
// messages, and a slot is kept sorted in key order, which is release order:
// due time, then priority descending, then publish order. Add of a key
// already held is a no-op that reports false, which the scheduler relies on
// when a key reaches it both from the store and from a publisher. Proving a
// key new is O(1) when it is later than, or has a newer sequence than,
// everything in its bucket (keys loaded in order, keys just published);
// otherwise Add looks through the bucket.
//
// Costs: Add and Cancel O(1), plus a binary search within a slot or a scan
// of one bucket when a key arrives out of order; Expire O(entries returned +
// Span/4096); Next O(Span/4096). Expire never returns an entry due after the
// time it is given, and the position Now() never moves back: if the wall
// clock goes back, keys due between the new time and Now() wait in over until
// the clock reaches them.
//
// # The scheduler
//
// One goroutine, Run's, owns the wheel and all loop state. Due batches go
// through a release pipeline of two more goroutines: publishLoop reads each
// batch from the store and hands it to the Releaser, in dispatch order, and
// confirmLoop awaits its confirms and reports back to the loop. A plain
// (not pipelined) Releaser gets one goroutine per Release call, at most
// MaxInFlight/BatchSize at once. store.Delete runs in one goroutine at a
// time, so deletes of confirmed messages group up (for DeleteLinger, if
// set). Run waits for all of them before returning.
//
//	loop ──batch keys──▶ publishLoop ──published──▶ confirmLoop
//	  ▲                  (Get, Publish)             (wait confirms)
//	  └──────────────────results──────────────────────────┘
//	loop ──confirmed keys──▶ delete goroutine ──done──▶ loop
//
// Loading. A cursor key splits the stored messages: every key below it has
// been scanned into the wheel (or released since), every key at or above it
// is only on disk. When less than half the horizon is loaded, the loader
// calls ScanKeys from the cursor to now+Horizon, at most 4096 keys per loop
// turn and at most MaxLoaded keys in the wheel. When a key below the cursor
// must go into a full wheel, the wheel's latest key is evicted and the
// cursor moves back to it, so the wheel always holds the earliest keys.
//
// Restart. The first load starts the cursor at the store's NextDue, so
// everything overdue drains first, in key order: oldest due first, by
// priority within a due time (invariant 4). The store sorts far messages
// into slots for the range a scan asks for before answering, so behind a
// backlog the loader asks for windows that start at one horizon and double
// while it is still behind: the first release after a long downtime waits
// for the first window only (measured: 2 ms after Open with 5M pending and
// two hours down, against two minutes when the whole backlog was asked for
// at once).
//
// Added and Cancelled. They append to a mutex-guarded inbox (at most 65536
// keys between two loop turns) and wake the loop; they never wait for it.
// Keys due at or after the upper end of the range the loader has started to
// scan are ignored: that end is published (atomically) before the scan
// begins, and Added is called after Put returned, so such a message is
// either seen by that scan or by a later one. The loop takes an inbox key
// into the wheel only if it is below the cursor; otherwise a later scan
// reads it from disk. A key may arrive both ways (stored before the scan
// began, announced after): the wheel ignores the second Add, and keys out
// for release or awaiting their delete are remembered and skipped. When the
// inbox is full, Added records the smallest key it dropped and the loop
// moves the cursor back to it, so the loader scans that range again (keys
// already held are no-ops). A Cancelled that is dropped or comes too late
// is harmless: release reads every message from the store first and skips
// the ones that are gone.
//
// Release. Due keys are taken from the wheel in order (ExpireN), at most
// BatchSize per Release call, at most MaxInFlight in calls, and within Rate
// (a token bucket holding 100 ms of the rate, waited for by timer, never by
// spinning). publishLoop reads the batch with store.Get, skips keys
// that are gone (cancelled), collects stale ones (exchange deleted or
// re-created: deleted and counted as discarded, never released) and hands
// the rest to the Releaser. Confirmed and stale keys are deleted in batched
// store.Delete calls; only then are they forgotten (invariant 2). Keys not
// confirmed go back into the wheel, ahead of everything due later, and all
// releases pause for the retry backoff (doubling from RetryBackoffMin to
// RetryBackoffMax, reset by a confirmed release), so order is kept: later
// messages do not overtake a failed one, though confirmed messages of the
// same batch are not withdrawn. More than 4×MaxInFlight keys waiting for
// their delete also pause releases.
//
// Time. The release decision is due <= now, in milliseconds of the injected
// clock's wall time, taken after the timer fired: a timer that fires early
// or late changes when the loop looks, never what it releases (invariant 3).
// The loop arms one timer for the earliest of: the next due key it may
// release, the next load, the end of a backoff or rate-limit wait, and one
// second (so a wall-clock jump is noticed within a second: timers run on the
// monotonic clock).
//
// Wall-clock jumps. Due times are wall-clock unix milliseconds, since they
// must survive restarts. If the clock goes back, nothing is released until
// the clock reaches each message's due time again: the wheel keeps its
// position and holds keys due before it until then, and the loader loads
// nothing new until now+Horizon passes the cursor. If the clock goes forward,
// everything now overdue is released at once, oldest due first and by
// priority, at Rate if one is set.
//
// Memory (invariant 5) does not depend on the number of pending messages:
// the wheel's slot table (24 bytes per slot: 1.5 MiB for the default minute),
// at most MaxLoaded keys in the wheel, the inbox, and at most 5×MaxInFlight
// keys out for release or delete.
package scheduler
