package pgstore

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayproxy/delayproxy/store"
)

// seqBlock is how many counters one nextval of message_seq reserves (its
// INCREMENT BY): a node hands them out in order, so that its later Puts
// order after its earlier ones; a key's sequence is keyedSeq of one.
const seqBlock = 1024

// notifyPayloadMax keeps one NOTIFY payload under PostgreSQL's 8000 bytes.
const notifyPayloadMax = 7800

// commit is one attempt at committing a batch of requests.
type commit struct {
	s       *Store
	shard   int16 // the count and tally rows this commit writes
	reqs    []*request
	refused map[*request]error // Puts refused by the registry: not in the transaction

	written, deleted int
	counts           map[uint64]int64   // stored messages per incarnation, the change
	tally            map[tallyRow]int64 // stored messages per due minute and partition, the change
	notify           []Announced        // keys due soon, announced at commit
	cancelled        []Announced        // keys due soon cancelled, announced at commit
}

// tallyRow is a row of the tally: a due minute, and the shard that says
// the partition (partition * shards + the committer's shard).
type tallyRow struct {
	minute int64
	shard  int16
}

// tallyOf is the row of the tally this commit counts a message in.
func (c *commit) tallyOf(due int64, inc uint64) tallyRow {
	return tallyRow{due / 60_000, int16(PartitionOf(inc))*shards + c.shard}
}

func newCommit(s *Store, reqs []*request, shard int16) *commit {
	return &commit{s: s, shard: shard, reqs: reqs, refused: map[*request]error{}, counts: map[uint64]int64{}, tally: map[tallyRow]int64{}}
}

// errNotLive is the SQLSTATE S.require_live raises.
const errNotLive = "DP001"

// run applies every request in one transaction and commits it: a batch of
// Puts alone in one round trip (fastPuts), anything else, or Puts that
// fast path found a dead incarnation in, in an explicit transaction.
func (c *commit) run(ctx context.Context) error {
	if err := c.fastPuts(ctx); !errors.Is(err, errSlowPath) {
		return err
	}
	return c.runTx(ctx)
}

// errSlowPath: the batch needs the explicit transaction.
var errSlowPath = errors.New("not for the fast path")

// fastPuts commits a batch of Puts only in two round trips on one
// connection: BEGIN with the COPY of the messages, then the check that
// every incarnation is live, the counts, the tally, the notification and
// COMMIT, pipelined. When the check fails nothing is written and the
// explicit transaction (runTx) finds the Puts to refuse.
func (c *commit) fastPuts(ctx context.Context) error {
	var vhosts, names []string
	var incs []int64
	type liveKey struct {
		vhost, name string
		inc         uint64
	}
	seen := map[liveKey]bool{}
	for _, r := range c.reqs {
		if r.kind != opPut {
			return errSlowPath
		}
		for _, m := range r.msgs {
			// Each exchange incarnation once: a batch is mostly one.
			if k := (liveKey{m.VHost, m.Exchange, m.Incarnation}); !seen[k] {
				seen[k] = true
				vhosts, names, incs = append(vhosts, m.VHost), append(names, m.Exchange), append(incs, int64(m.Incarnation))
			}
		}
	}
	rows := c.encodePuts(c.reqs)
	conn, err := c.s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection left inside the transaction (an error before ROLLBACK
	// answered) is closed by Release, never reused.
	defer conn.Release()
	if _, err := conn.Conn().PgConn().CopyFrom(ctx, rows.reader(), "BEGIN; "+sql(c.s.schema, copyMessagesSQL)); err != nil {
		rollback(ctx, conn.Conn())
		return err
	}
	b := &pgx.Batch{}
	b.Queue(sql(c.s.schema, `SELECT S.require_live($1, $2, $3)`), vhosts, names, incs)
	c.queueCounts(b)
	b.Queue(`COMMIT`)
	err = conn.SendBatch(ctx, b).Close()
	if err != nil {
		rollback(ctx, conn.Conn())
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == errNotLive {
		*c = *newCommit(c.s, c.reqs, c.shard)
		return errSlowPath
	}
	return err
}

// rollback ends the failed transaction on conn, when the connection
// still answers, so that it goes back to the pool.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		_, _ = conn.Exec(ctx, `ROLLBACK`)
	}
}

// runTx applies every request in one explicit transaction and commits it.
func (c *commit) runTx(ctx context.Context) error {
	tx, err := c.s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, r := range c.reqs {
		r.cancelled = nil
	}
	c.cancelled = nil
	if err := c.cancels(ctx, tx); err != nil {
		return err
	}
	if err := c.deletes(ctx, tx); err != nil {
		return err
	}
	accepted, err := c.puts(ctx, tx)
	if err != nil {
		return err
	}
	if rows := c.encodePuts(accepted); rows != nil {
		if _, err := tx.Conn().PgConn().CopyFrom(ctx, rows.reader(), sql(c.s.schema, copyMessagesSQL)); err != nil {
			return err
		}
	}
	b := &pgx.Batch{}
	c.queueCounts(b)
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// removed accounts for a message deleted by the transaction.
func (c *commit) removed(k store.Key, inc uint64) {
	c.deleted++
	c.counts[inc]--
	c.tally[c.tallyOf(k.Due(), inc)]--
}

// cancels runs the cancel requests, each its own statement: each wants to
// know which of its messages were pending (their incarnation live).
func (c *commit) cancels(ctx context.Context, tx pgx.Tx) error {
	const byID = `WITH d AS (DELETE FROM S.messages WHERE vhost = $1 AND exchange = $2 AND message_id = $3 AND message_id <> ''
		RETURNING k, incarnation)
	SELECT d.k, d.incarnation, e.incarnation IS NOT NULL FROM d LEFT JOIN S.exchanges e ON e.incarnation = d.incarnation`
	const byKey = `WITH d AS (DELETE FROM S.messages WHERE part = $1 AND k = $2 RETURNING k, incarnation)
	SELECT d.k, d.incarnation, e.incarnation IS NOT NULL FROM d LEFT JOIN S.exchanges e ON e.incarnation = d.incarnation`
	soon := c.s.opts.Now().Add(c.s.opts.NotifyWithin).UnixMilli() // cancels of keys due before are announced
	for _, r := range c.reqs {
		var rows pgx.Rows
		var err error
		switch r.kind {
		case opCancelID:
			rows, err = tx.Query(ctx, sql(c.s.schema, byID), r.vhost, r.exchange, r.id)
		case opCancelKey:
			rows, err = tx.Query(ctx, sql(c.s.schema, byKey), partOf(r.keys[0]), r.keys[0][:])
		default:
			continue
		}
		if err != nil {
			return err
		}
		var kb []byte
		var inc uint64
		var live bool
		_, err = pgx.ForEachRow(rows, []any{&kb, &inc, &live}, func() error {
			k, err := toKey(kb)
			if err != nil {
				return err
			}
			c.removed(k, inc)
			if live {
				r.cancelled = append(r.cancelled, k)
				if c.s.opts.NotifyWithin >= 0 && k.Due() < soon {
					c.cancelled = append(c.cancelled, Announced{k, PartitionOf(inc)})
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// deletes removes the keys of every Delete request in one statement.
func (c *commit) deletes(ctx context.Context, tx pgx.Tx) error {
	var keys []store.Key
	for _, r := range c.reqs {
		if r.kind == opDelete {
			keys = append(keys, r.keys...)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, sql(c.s.schema, `DELETE FROM S.messages WHERE `+byKeysSQL+` RETURNING k, incarnation`), keysArg(keys)...)
	if err != nil {
		return err
	}
	var kb []byte
	var inc uint64
	_, err = pgx.ForEachRow(rows, []any{&kb, &inc}, func() error {
		k, err := toKey(kb)
		if err != nil {
			return err
		}
		c.removed(k, inc)
		return nil
	})
	return err
}

// puts checks every Put request's incarnations against the registry in
// the transaction, refuses the requests with one that is not live and
// returns the others.
func (c *commit) puts(ctx context.Context, tx pgx.Tx) ([]*request, error) {
	var vhosts, names []string
	seen := map[exKey]bool{}
	for _, r := range c.reqs {
		if r.kind != opPut {
			continue
		}
		for _, m := range r.msgs {
			if k := (exKey{m.VHost, m.Exchange}); !seen[k] {
				seen[k] = true
				vhosts, names = append(vhosts, m.VHost), append(names, m.Exchange)
			}
		}
	}
	if len(vhosts) == 0 {
		return nil, nil
	}
	live := map[exKey]uint64{}
	rows, err := tx.Query(ctx, sql(c.s.schema, `SELECT e.vhost, e.name, e.incarnation FROM S.exchanges e
		JOIN unnest($1::text[], $2::text[]) AS u(vhost, name) ON e.vhost = u.vhost AND e.name = u.name`), vhosts, names)
	if err != nil {
		return nil, err
	}
	var k exKey
	var inc uint64
	if _, err := pgx.ForEachRow(rows, []any{&k.vhost, &k.name, &inc}, func() error { live[k] = inc; return nil }); err != nil {
		return nil, err
	}
	var accepted []*request
	for _, r := range c.reqs {
		if r.kind != opPut {
			continue
		}
		for _, m := range r.msgs {
			if inc, ok := live[exKey{m.VHost, m.Exchange}]; !ok || m.Incarnation == 0 || inc != m.Incarnation {
				c.refused[r] = fmt.Errorf("%w: %q in vhost %q (incarnation %d)", store.ErrUnknownExchange, m.Exchange, m.VHost, m.Incarnation)
				break
			}
		}
		if c.refused[r] == nil {
			accepted = append(accepted, r)
		}
	}
	return accepted, nil
}

// encodePuts accounts for the messages of reqs (Puts, their keys set)
// and returns them as the rows of one COPY; nil when there are none.
func (c *commit) encodePuts(reqs []*request) *copyRows {
	n, size := 0, 0
	for _, r := range reqs {
		for _, m := range r.msgs {
			n, size = n+1, size+copyRowSize(m)
		}
	}
	if n == 0 {
		return nil
	}
	rows := newCopyRows(size)
	soon := c.s.opts.Now().Add(c.s.opts.NotifyWithin).UnixMilli()
	for _, r := range reqs {
		for _, m := range r.msgs {
			rows.add(m)
			c.written++
			c.counts[m.Incarnation]++
			c.tally[c.tallyOf(m.Due, m.Incarnation)]++
			if c.s.opts.NotifyWithin >= 0 && m.Due < soon {
				c.notify = append(c.notify, Announced{m.Key, PartitionOf(m.Incarnation)})
			}
		}
	}
	return rows
}

// queueCounts queues on b the changes of the counts and the tally (this
// node's shard rows, in key order so that concurrent commits lock them in
// the same order) and the notifications of the keys due soon, stored and
// cancelled.
func (c *commit) queueCounts(b *pgx.Batch) {
	s := c.s
	if incs, ns := sortedDeltas(c.counts); len(incs) > 0 {
		b.Queue(sql(s.schema, `INSERT INTO S.counts (incarnation, shard, n)
			SELECT i, $3, n FROM unnest($1::bigint[], $2::bigint[]) AS u(i, n)
			ON CONFLICT (incarnation, shard) DO UPDATE SET n = S.counts.n + EXCLUDED.n`), incs, ns, c.shard)
	}
	if minutes, tshards, ns := c.tallyDeltas(); len(minutes) > 0 {
		b.Queue(sql(s.schema, `INSERT INTO S.tally (minute, shard, n)
			SELECT m, s, n FROM unnest($1::bigint[], $2::smallint[], $3::bigint[]) AS u(m, s, n)
			ON CONFLICT (minute, shard) DO UPDATE SET n = S.tally.n + EXCLUDED.n`), minutes, tshards, ns)
		if slices.ContainsFunc(ns, func(n int64) bool { return n < 0 }) { // only a decrement can empty a row
			b.Queue(sql(s.schema, `DELETE FROM S.tally t USING unnest($1::bigint[], $2::smallint[]) AS u(m, s)
				WHERE t.minute = u.m AND t.shard = u.s AND t.n = 0`), minutes, tshards)
		}
	}
	if len(c.notify) > 0 {
		b.Queue(`SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, s.channel(keysChannel), notifyPayloads(s.node, c.notify))
	}
	if len(c.cancelled) > 0 {
		b.Queue(`SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, s.channel(cancelChannel), notifyPayloads(s.node, c.cancelled))
	}
}

// sortedDeltas lists the non-zero changes of m by key.
func sortedDeltas[K uint64 | int64](m map[K]int64) (keys []int64, deltas []int64) {
	ks := make([]K, 0, len(m))
	for k, d := range m {
		if d != 0 {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, cmp.Compare[K])
	for _, k := range ks {
		keys, deltas = append(keys, int64(k)), append(deltas, m[k])
	}
	return keys, deltas
}

// tallyDeltas lists the non-zero changes of the tally in row order (the
// order concurrent commits lock them in).
func (c *commit) tallyDeltas() (minutes []int64, tshards []int16, deltas []int64) {
	rows := make([]tallyRow, 0, len(c.tally))
	for r, d := range c.tally {
		if d != 0 {
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b tallyRow) int {
		return cmp.Or(cmp.Compare(a.minute, b.minute), cmp.Compare(a.shard, b.shard))
	})
	for _, r := range rows {
		minutes, tshards, deltas = append(minutes, r.minute), append(tshards, r.shard), append(deltas, c.tally[r])
	}
	return minutes, tshards, deltas
}

// notifyPayloads packs keys, each as its partition and the key in hex,
// after the sending node's id, into payloads PostgreSQL accepts:
// "node p.key p.key ...".
func notifyPayloads(node string, keys []Announced) []string {
	var out []string
	var sb strings.Builder
	for _, a := range keys {
		if sb.Len() == 0 {
			sb.WriteString(node)
		}
		sb.WriteByte(' ')
		sb.WriteString(strconv.Itoa(a.Partition))
		sb.WriteByte('.')
		sb.WriteString(hex.EncodeToString(a.Key[:]))
		if sb.Len() > notifyPayloadMax {
			out = append(out, sb.String())
			sb.Reset()
		}
	}
	if sb.Len() > 0 {
		out = append(out, sb.String())
	}
	return out
}

// takeSeqs hands out n counters, in order, from this node's reserved
// blocks, reserving the blocks it lacks in one statement. Called by the
// writer only.
func (s *Store) takeSeqs(ctx context.Context, n int) ([]uint64, error) {
	if lack := n - int(s.seqEnd-s.seqNext); lack > 0 {
		rows, err := s.pool.Query(ctx, sql(s.schema, `SELECT nextval('S.message_seq') FROM generate_series(1, $1)`), (lack+seqBlock-1)/seqBlock)
		if err != nil {
			return nil, err
		}
		starts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, err
		}
		slices.Sort(starts)
		for _, v := range starts {
			s.seqBlocks = append(s.seqBlocks, uint64(v))
		}
	}
	out := make([]uint64, 0, n)
	for len(out) < n {
		if s.seqNext == s.seqEnd {
			s.seqNext, s.seqEnd = s.seqBlocks[0], s.seqBlocks[0]+seqBlock
			s.seqBlocks = s.seqBlocks[1:]
		}
		out = append(out, s.seqNext)
		s.seqNext++
	}
	return out, nil
}

// toKey checks that b is a stored key.
func toKey(b []byte) (store.Key, error) {
	var k store.Key
	if len(b) != store.KeySize {
		return k, fmt.Errorf("store: stored key of %d bytes", len(b))
	}
	copy(k[:], b)
	return k, nil
}
