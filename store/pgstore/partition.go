package pgstore

import (
	"context"
	"slices"

	"github.com/delayproxy/delayproxy/store"
)

// Partitions is how many partitions the messages are divided into for the
// releaser role: a message's partition is its exchange's incarnation
// modulo Partitions (PartitionOf), so all the messages of one exchange
// incarnation are in one partition and released by one node at a time, in
// order. It is a constant of the schema: the index messages_partition
// (schema version 2) is on (incarnation % 8).
const Partitions = 8

// partitionSQL is a message's partition in SQL, written as the index
// messages_partition is, so that the planner uses it.
const partitionSQL = `(incarnation % 8)`

// viewScanChunk is the most keys a View's ScanKeys reads per statement
// (growing from firstScanChunk as ScanKeys's do): the scheduler's load
// (4,096 at a time), as each statement reads up to that many keys of every
// partition of the view.
const viewScanChunk = 4096

// viewChunkSQL reads up to $3 keys k of the partitions $4 with $1 <= k <
// $2 (keyChunk puts > for >=), in order: each partition's in order on the
// index messages_partition, then the first $3 of them all.
const viewChunkSQL = `SELECT x.k FROM unnest($4::bigint[]) AS p(p) CROSS JOIN LATERAL (
	SELECT k FROM S.messages WHERE ` + partitionSQL + ` = p.p AND k >= $1 AND k < $2 ORDER BY k LIMIT $3) x
	ORDER BY x.k LIMIT $3`

// viewNextDueSQL reads the first key of the partitions $1: one index probe
// each.
const viewNextDueSQL = `SELECT x.k FROM unnest($1::bigint[]) AS p(p) CROSS JOIN LATERAL (
	SELECT k FROM S.messages WHERE ` + partitionSQL + ` = p.p ORDER BY k LIMIT 1) x
	ORDER BY x.k LIMIT 1`

// PartitionOf is the partition of the messages of an exchange incarnation.
func PartitionOf(incarnation uint64) int { return int(incarnation % Partitions) }

// Announced is a key another node (or this one) announced, with its
// partition; Partition is -1 when the announcing node did not say it.
type Announced struct {
	Key       store.Key
	Partition int
}

// View is the store restricted to a set of partitions, for the Scheduler
// of the node that holds their releaser roles: ScanKeys, NextDue,
// Upcoming and Get read only the messages of those partitions; the rest
// is the Store's. It satisfies scheduler.Store.
type View struct {
	s     *Store
	parts []int64 // ascending
}

// View is the store restricted to the partitions parts (each in [0,
// Partitions)).
func (s *Store) View(parts []int) *View {
	v := &View{s: s}
	for _, p := range parts {
		v.parts = append(v.parts, int64(p))
	}
	slices.Sort(v.parts)
	v.parts = slices.Compact(v.parts)
	if v.parts == nil {
		v.parts = []int64{} // none, not all
	}
	return v
}

// holds reports whether the view's partitions hold the messages of inc.
func (v *View) holds(inc uint64) bool {
	_, ok := slices.BinarySearch(v.parts, int64(PartitionOf(inc)))
	return ok
}

// ScanKeys calls fn with the keys of the view's partitions due in [from,
// until), in key order; see store.Store. Each chunk reads each partition
// in key order on the index messages_partition.
func (v *View) ScanKeys(from, until int64, fn func(store.Key) error) error {
	if v.all() {
		return v.s.ScanKeys(from, until, fn) // one ordered read of the key index
	}
	return v.s.scanKeys(v.parts, from, until, fn)
}

// all reports whether the view holds every partition: it then reads as
// the store does, on the primary key, rather than partition by partition
// (each chunk would read up to Partitions times the keys it keeps).
func (v *View) all() bool { return len(v.parts) == Partitions }

// NextDue is the due time of the earliest message of the view's
// partitions: one index probe per partition.
func (v *View) NextDue() (int64, bool) {
	if v.all() {
		return v.s.NextDue()
	}
	return v.s.nextDue(viewNextDueSQL, v.parts)
}

// Upcoming counts the messages of the view's partitions by due time, as
// store.Store's Upcoming does: from the tally rows of those partitions
// and the count rows of their incarnations.
func (v *View) Upcoming(bounds []int64) []int64 { return v.s.upcoming(v.parts, bounds) }

// Get reads messages by key; a message of another partition is nil, as if
// gone (its partition's holder releases it).
func (v *View) Get(keys []store.Key) ([]*store.Message, error) {
	msgs, err := v.s.Get(keys)
	for i, m := range msgs {
		if m != nil && !v.holds(m.Incarnation) {
			msgs[i] = nil
		}
	}
	return msgs, err
}

// Stale is the Store's.
func (v *View) Stale(m *store.Message) bool { return v.s.Stale(m) }

// Delete is the Store's.
func (v *View) Delete(ctx context.Context, keys ...store.Key) error { return v.s.Delete(ctx, keys...) }

// Exchange is the Store's.
func (v *View) Exchange(vhost, name string) (store.ExchangeDef, bool) {
	return v.s.Exchange(vhost, name)
}

// DeleteExchange is the Store's.
func (v *View) DeleteExchange(ctx context.Context, vhost, name string) (int64, error) {
	return v.s.DeleteExchange(ctx, vhost, name)
}
