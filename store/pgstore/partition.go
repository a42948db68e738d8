package pgstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/delayproxy/delayproxy/store"
)

// Partitions is how many partitions the messages are divided into for the
// releaser role: a message's partition is its exchange's incarnation
// modulo Partitions (PartitionOf), so all the messages of one exchange
// incarnation are in one partition and released by one node at a time, in
// order. It is a constant of the schema: the column part, which leads the
// primary key (part, k) since schema version 3.
const Partitions = 8

// PartitionOf is the partition of the messages of an exchange incarnation.
func PartitionOf(incarnation uint64) int { return int(incarnation % Partitions) }

// partOf is the partition of the message stored under k: the writer gives
// every key a sequence whose remainder modulo Partitions is the partition
// of its message (keyedSeq), so that a key alone finds its row.
func partOf(k store.Key) int16 { return int16(k.Seq() % Partitions) }

// keyedSeq is the sequence of a key of partition part, from a counter the
// node hands out in order: later counters make later sequences, whatever
// the partitions.
func keyedSeq(counter uint64, part int) uint64 { return counter*Partitions + uint64(part) }

// branches writes one statement per partition, branch(i) for partition
// slot i, joined by UNION ALL.
func branches(branch func(i int) string) string {
	var b strings.Builder
	for i := range Partitions {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString(branch(i))
	}
	return b.String()
}

// keyChunkSQL reads, in key order, up to $3 keys k with k op $1 and k <
// $2 of the partitions in $4 (an array of Partitions elements, -1 for
// none; partsArg): a Merge Append of one range of the primary key per
// partition, each read only as far as the merge takes it, so a statement
// reads about $3 keys however many partitions.
func keyChunkSQL(op string) string {
	return `SELECT k FROM (` + branches(func(i int) string {
		return fmt.Sprintf(`(SELECT k FROM S.messages WHERE part = ($4::smallint[])[%d] AND k %s $1 AND k < $2 ORDER BY k LIMIT $3)`, i+1, op)
	}) + `) x ORDER BY k LIMIT $3`
}

// keyChunkFromSQL and keyChunkAfterSQL are keyChunkSQL from $1 and after
// it.
var (
	keyChunkFromSQL  = keyChunkSQL(">=")
	keyChunkAfterSQL = keyChunkSQL(">")
)

// nextDueSQL reads the first key of the partitions in $1 (as $4 of
// keyChunkSQL): one probe of the primary key each.
var nextDueSQL = `SELECT k FROM (` + branches(func(i int) string {
	return fmt.Sprintf(`(SELECT k FROM S.messages WHERE part = ($1::smallint[])[%d] ORDER BY k LIMIT 1)`, i+1)
}) + `) x ORDER BY k LIMIT 1`

// partsArg is parts (each in [0, Partitions), ascending, none twice) as
// the array of Partitions elements keyChunkSQL and nextDueSQL take.
func partsArg(parts []int16) []int16 {
	arg := slices.Repeat([]int16{-1}, Partitions)
	copy(arg, parts)
	return arg
}

// allParts is every partition, in order.
var allParts = func() []int16 {
	parts := make([]int16, Partitions)
	for i := range parts {
		parts[i] = int16(i)
	}
	return parts
}()

// byKeysSQL is the condition that finds the rows of the keys keysArg
// gives as parameters $1 to $8: one set of probes of the primary key per
// partition (a BitmapOr of index scans).
var byKeysSQL = func() string {
	conds := make([]string, Partitions)
	for i := range conds {
		conds[i] = fmt.Sprintf("(part = %d AND k = ANY($%d))", i, i+1)
	}
	return strings.Join(conds, " OR ")
}()

// keysArg is keys as the parameters of byKeysSQL: the keys of each
// partition, in partition order.
func keysArg(keys []store.Key) []any {
	byPart := make([][][]byte, Partitions)
	for i := range keys {
		p := partOf(keys[i])
		byPart[p] = append(byPart[p], keys[i][:])
	}
	args := make([]any, Partitions)
	for p, ks := range byPart {
		if ks == nil {
			ks = [][]byte{}
		}
		args[p] = ks
	}
	return args
}

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
	parts []int16 // ascending
}

// View is the store restricted to the partitions parts (each in [0,
// Partitions)).
func (s *Store) View(parts []int) *View {
	v := &View{s: s}
	for _, p := range parts {
		v.parts = append(v.parts, int16(p))
	}
	slices.Sort(v.parts)
	v.parts = slices.Compact(v.parts)
	if v.parts == nil {
		v.parts = []int16{} // none, not all
	}
	return v
}

// holds reports whether the view's partitions hold the messages of inc.
func (v *View) holds(inc uint64) bool {
	_, ok := slices.BinarySearch(v.parts, int16(PartitionOf(inc)))
	return ok
}

// ScanKeys calls fn with the keys of the view's partitions due in [from,
// until), in key order; see store.Store.
func (v *View) ScanKeys(from, until int64, fn func(store.Key) error) error {
	return v.s.scanKeys(v.parts, from, until, fn)
}

// NextDue is the due time of the earliest message of the view's
// partitions: one index probe per partition.
func (v *View) NextDue() (int64, bool) { return v.s.nextDue(v.parts) }

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
