package pgstore_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// partitionWant is what a view of parts should read of msgs.
type partitionWant struct {
	parts []int
	msgs  []*store.Message
}

func (w partitionWant) in(m *store.Message) bool {
	return slices.Contains(w.parts, pgstore.PartitionOf(m.Incarnation))
}

// keys are the keys of the view's messages due in [from, until), in order.
func (w partitionWant) keys(from, until int64) []store.Key {
	var out []store.Key
	for _, m := range w.msgs {
		if w.in(m) && m.Due >= from && m.Due < until {
			out = append(out, m.Key)
		}
	}
	slices.SortFunc(out, func(a, b store.Key) int { return strings.Compare(string(a[:]), string(b[:])) })
	return out
}

// upcoming counts the view's messages as Upcoming does.
func (w partitionWant) upcoming(bounds []int64) []int64 {
	out := make([]int64, len(bounds)+1)
	for _, m := range w.msgs {
		if w.in(m) {
			i, _ := slices.BinarySearchFunc(bounds, m.Due, func(b, t int64) int {
				if b <= t {
					return -1
				}
				return 1
			})
			out[i]++
		}
	}
	return out
}

// checkView compares what a view of w.parts reads with w.
func checkView(t *testing.T, s *pgstore.Store, w partitionWant) {
	t.Helper()
	v := s.View(w.parts)
	for _, r := range [][2]int64{{0, math.MaxInt64}, {storetest.Base + 100_000, storetest.Base + 500_000}} {
		var got []store.Key
		if err := v.ScanKeys(r[0], r[1], func(k store.Key) error { got = append(got, k); return nil }); err != nil {
			t.Fatal(err)
		}
		if want := w.keys(r[0], r[1]); !slices.Equal(got, want) {
			t.Errorf("partitions %v: ScanKeys(%d, %d) read %d keys, want %d (or another order)", w.parts, r[0], r[1], len(got), len(want))
		}
	}
	all := w.keys(0, math.MaxInt64)
	due, ok := v.NextDue()
	if len(all) == 0 {
		if ok {
			t.Errorf("partitions %v: NextDue = %d, true; want none", w.parts, due)
		}
	} else if !ok || due != all[0].Due() {
		t.Errorf("partitions %v: NextDue = %d, %v; want %d", w.parts, due, ok, all[0].Due())
	}
	bounds := []int64{storetest.Base + 60_000, storetest.Base + 300_000, storetest.Base + 600_000}
	if got, want := v.Upcoming(bounds), w.upcoming(bounds); !slices.Equal(got, want) {
		t.Errorf("partitions %v: Upcoming = %v, want %v", w.parts, got, want)
	}
	keys := make([]store.Key, len(w.msgs))
	for i, m := range w.msgs {
		keys[i] = m.Key
	}
	got, err := v.Get(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range w.msgs {
		if (got[i] != nil) != w.in(m) {
			t.Fatalf("partitions %v: Get of a message of partition %d: %v", w.parts, pgstore.PartitionOf(m.Incarnation), got[i])
		}
	}
}

// TestViewReads: a view of a set of partitions scans, finds the next due
// time of, counts and gets only the messages of its partitions; the scan
// goes over several chunks.
func TestViewReads(t *testing.T) {
	s := teststore.OpenPG(t, teststore.PGSchema(t), pgstore.Options{})
	var exs []store.ExchangeDef
	for i := range 10 {
		exs = append(exs, storetest.Exchange(t, s, "/", fmt.Sprintf("x%d", i)))
	}
	var msgs []*store.Message
	for i := range 12_000 {
		m := storetest.Message(exs[i%10].Name, storetest.Base+int64(i*37%1000)*1000, uint8(i%3), "b")
		msgs = append(msgs, m)
	}
	for c := range slices.Chunk(msgs, 2000) {
		storetest.Put(t, s, c...)
	}
	p := func(i int) int { return pgstore.PartitionOf(exs[i].Incarnation) }
	for _, parts := range [][]int{{}, {p(0)}, {p(1), p(3)}, {0, 1, 2, 3, 4, 5, 6, 7}} {
		checkView(t, s, partitionWant{parts: parts, msgs: msgs})
	}
}

// TestViewPlansUseTheIndex: at 200,000 messages in 8 partitions, a view's
// scan and next due read the primary key, partition by partition, and
// never scan the table; a scan merges the partitions' ranges as far as
// its limit.
func TestViewPlansUseTheIndex(t *testing.T) {
	ctx := context.Background()
	schema := teststore.PGSchema(t)
	if err := pgstore.MigrateTo(ctx, teststore.PGURL(), schema, 3); err != nil {
		t.Fatal(err)
	}
	// Rows written straight, without the counts: only the plans matter.
	exec(t, fmt.Sprintf(`INSERT INTO %s.messages (part, k, incarnation, vhost, exchange, routing_key, mandatory, properties, body, delay, priority, message_id)
		SELECT (i %% 8 + 1) %% 8, int8send(%d + i * 10) || '\xff'::bytea || int8send(i * 8 + (i %% 8 + 1) %% 8), i %% 8 + 1, '/', 'x', '', false, '', '', 0, 0, ''
		FROM generate_series(1, 200000) AS i`, schema, storetest.Base), "ANALYZE "+schema+".messages")
	conn, err := pgx.Connect(ctx, teststore.PGURL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	parts := []int16{1, 2, 5, -1, -1, -1, -1, -1}
	for name, q := range pgstore.ViewQueries {
		args := []any{parts}
		if name == "scan" {
			args = []any{[]byte{0}, []byte{0xff}, 10_000, parts}
		}
		rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+strings.ReplaceAll(q, "S.", schema+"."), args...)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "Merge Append") || !strings.Contains(text, "messages_pkey") || strings.Contains(text, "Seq Scan") {
			t.Errorf("%s: the plan does not merge ranges of the primary key:\n%s", name, text)
		}
		if name == "scan" {
			// Each partition's range is read only as far as the merge
			// took it: about 10,000 index entries in all, not 10,000 each.
			read := 0
			for _, line := range plan {
				var n int
				if i := strings.Index(line, "Index Only Scan"); i < 0 {
					continue
				}
				if _, err := fmt.Sscanf(line[strings.Index(line, "(actual rows="):], "(actual rows=%d", &n); err != nil {
					t.Fatalf("scan: %q: %v", line, err)
				}
				read += n
			}
			if read < 10_000 || read > 10_000+pgstore.Partitions {
				t.Errorf("scan: the partitions' ranges read %d keys for 10,000:\n%s", read, text)
			}
		}
	}
}

// TestUpgradeFromVersion1: a schema at version 1 with messages (their
// tally rows in version 1's shards) is migrated by Open: the counts and
// tally check, every old message has its new key (sequence * 8 +
// partition, version 3), views read the old messages by partition, and new
// ones are stored beside them, after them in key order.
func TestUpgradeFromVersion1(t *testing.T) {
	ctx := context.Background()
	schema := teststore.PGSchema(t)
	if err := pgstore.MigrateTo(ctx, teststore.PGURL(), schema, 1); err != nil {
		t.Fatal(err)
	}
	// As version 1 wrote them: three exchanges, 300 messages, the counts
	// and tally in shard 0.
	var msgs []*store.Message
	stmts := []string{}
	for e := range 3 {
		inc := uint64(e + 1)
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO %s.exchanges (vhost, name, kind, delayed_type, durable, auto_delete, internal, arguments, incarnation)
			VALUES ('/', 'x%d', 0, 'direct', true, false, false, '', %d)`, schema, e, inc),
			fmt.Sprintf(`INSERT INTO %s.counts VALUES (%d, 0, 100)`, schema, inc))
		for i := range 100 {
			m := storetest.Message(fmt.Sprintf("x%d", e), storetest.Base+int64(i)*6_000, 0, "old")
			m.Incarnation, m.Key = inc, store.MakeKey(storetest.Base+int64(i)*6_000, 0, uint64(e*100+i))
			msgs = append(msgs, m)
			stmts = append(stmts, fmt.Sprintf(`INSERT INTO %s.messages VALUES ('\x%x', %d, '/', 'x%d', '', false, '', 'old', 0, 0, '')`,
				schema, m.Key[:], inc, e))
		}
	}
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO %s.tally SELECT %d + g, 0, 30 FROM generate_series(0, 9) AS g`, schema, storetest.Base/60_000),
		fmt.Sprintf(`SELECT nextval('%s.message_seq')`, schema)) // the block the sequences above came from
	exec(t, stmts...)

	s := teststore.OpenPG(t, schema, pgstore.Options{})
	if err := s.Check(); err != nil {
		t.Fatalf("after the upgrade: %v", err)
	}
	for _, m := range msgs {
		m.Key = store.MakeKey(m.Due, m.Priority, m.Key.Seq()*pgstore.Partitions+uint64(pgstore.PartitionOf(m.Incarnation)))
	}
	for _, parts := range [][]int{{1}, {2, 3}, {0, 4, 5, 6, 7}} {
		checkView(t, s, partitionWant{parts: parts, msgs: msgs})
	}
	m := storetest.Message("x1", storetest.Base, 0, "new")
	storetest.Put(t, s, m)
	if old := msgs[100]; store.CompareKeys(m.Key, old.Key) <= 0 || m.Key.Due() != old.Key.Due() {
		t.Errorf("a new message's key %x does not follow an old one's of the same due time, %x", m.Key, old.Key)
	}
	msgs = append(msgs, m)
	checkView(t, s, partitionWant{parts: []int{2}, msgs: msgs})
	if got := s.Upcoming([]int64{storetest.Base + 60_000}); got[0] != 31 || got[1] != 270 {
		t.Errorf("Upcoming of the whole store = %v, want [31 270]", got)
	}
}
