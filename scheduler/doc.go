// Package scheduler releases delayed messages at their due time, never early.
//
// It has two parts. Wheel is a plain data structure (no goroutines, no locks,
// the time passed in) holding the keys of the messages due within the near
// horizon. Scheduler is the loop that owns a Wheel, feeds it from the store
// as the horizon advances, and hands due messages to a Releaser.
//
// # The wheel
//
// A hashed timing wheel with one slot per millisecond, Span() slots (a power
// of two, at least the horizon), and the time kept as unix milliseconds:
//
//	due <= Now()            over: sorted slice, returned first by Expire
//	Now() < due <= Horizon() slots[due & (Span-1)]: sorted slice of keys
//	due > Horizon()          refused by Add (the caller keeps it on disk)
//
//	occ: 1 bit per slot, set when the slot is not empty (Span/64 words)
//	sum: 1 bit per occ word, set when that word is not zero (Span/4096 words)
//
// Within the span every slot holds exactly one due time, so no entry carries
// a round count and a slot is drained whole when the wheel passes it. Next
// finds the first non-empty slot by scanning at most Span/4096 summary words
// plus two occupancy words, so the driver arms one timer to exactly the next
// due time and never ticks through empty milliseconds.
//
// Why hashed and single level rather than hierarchical (Kafka's purgatory,
// Varghese and Lauck's scheme 6): the horizon is short (a minute by default)
// and the scheduler refills it from the store, which is itself a wheel on
// disk, so a single level of 65536 1 ms slots covers it in 1.5 MiB of slice
// headers and 8 KiB of bitmap. There is no cascading, so every entry is
// placed once in its final, millisecond-exact slot, and Next and Cancel are
// exact.
//
// Entries are store.Key values (17 bytes: due, 255-priority, sequence), not
// messages, and a slot is kept sorted in key order, which is release order:
// due time, then priority descending, then publish order. Keys usually arrive
// in order within a millisecond (the sequence grows), so Add is an append; a
// higher priority arriving later costs a binary search and a move within one
// slot. Add of a key already held is a no-op that reports false, which the
// scheduler relies on when a key reaches it both from the store and from a
// publisher.
//
// Costs: Add and Cancel O(1) plus O(log s) within a slot of s entries;
// Expire O(entries returned + Span/4096); Next O(Span/4096). Expire never
// returns an entry due after the time it is given, and the position Now()
// never moves back: if the wall clock goes back, entries due between the new
// time and Now() wait in over until the clock reaches them.
package scheduler
