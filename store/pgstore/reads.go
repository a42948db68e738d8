package pgstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/store"
)

// Reads run on a pooled connection each, without the writer: they see what
// is committed, by any node.

const messageColumnsSQL = `k, incarnation, vhost, exchange, routing_key, mandatory, properties, delay, priority, message_id`

// scanMessage reads the columns of messageColumnsSQL (and body when
// withBody) into a Message.
func scanMessage(rows pgx.Rows, withBody bool) (*store.Message, error) {
	m := &store.Message{}
	var kb []byte
	var prio int16
	dest := []any{&kb, &m.Incarnation, &m.VHost, &m.Exchange, &m.RoutingKey, &m.Mandatory, &m.Properties, &m.Delay, &prio, &m.MessageID}
	if withBody {
		dest = append(dest, &m.Body)
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	k, err := toKey(kb)
	if err != nil {
		return nil, err
	}
	m.Key, m.Due, m.Priority = k, k.Due(), uint8(prio)
	if withBody && m.Body == nil {
		m.Body = []byte{}
	}
	return m, nil
}

// Get reads messages by key; see store.Store.
func (s *Store) Get(keys []store.Key) ([]*store.Message, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	out := make([]*store.Message, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	at := make(map[store.Key][]int, len(keys))
	unique := make([]store.Key, 0, len(keys))
	for i, k := range keys {
		if at[k] == nil {
			unique = append(unique, k)
		}
		at[k] = append(at[k], i)
	}
	ctx, cancel := readCtx()
	defer cancel()
	rows, err := s.pool.Query(ctx, sql(s.schema, `SELECT `+messageColumnsSQL+`, body FROM S.messages WHERE `+byKeysSQL), keysArg(unique)...)
	if err != nil {
		return nil, fmt.Errorf("store: get: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		m, err := scanMessage(rows, true)
		if err != nil {
			return nil, fmt.Errorf("store: get: %w", err)
		}
		for n, i := range at[m.Key] {
			if n == 0 {
				out[i] = m
			} else {
				c := *m
				out[i] = &c
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: get: %w", err)
	}
	return out, nil
}

// dueBound is the smallest key due at due, as bytes: keys due in
// [from, until) are those in [dueBound(from), dueBound(until)).
func dueBound(due int64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, uint64(max(due, 0)))
	return b
}

// scanChunk is the most keys ScanKeys (a View's too) reads per statement.
// Its first statement reads firstScanChunk, and each next one twice as
// many: a caller that stops early (the scheduler's loader takes 512 or
// 4,096 keys at a time) does not make the database read and send ten
// thousand.
const (
	scanChunk      = 10_000
	firstScanChunk = 256
)

// ScanKeys calls fn with the keys due in [from, until); see store.Store.
// It reads them in chunks by key, so fn runs outside any statement.
func (s *Store) ScanKeys(from, until int64, fn func(store.Key) error) error {
	return s.scanKeys(allParts, from, until, fn)
}

// scanKeys is ScanKeys over the partitions parts.
func (s *Store) scanKeys(parts []int16, from, until int64, fn func(store.Key) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	if until <= from || until <= 0 {
		return nil
	}
	lo, hi := dueBound(from), dueBound(until)
	if until == math.MaxInt64 {
		hi = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	}
	if len(parts) == 0 {
		return nil
	}
	chunk := firstScanChunk
	after := false // lo itself is in the range until a chunk ends at it
	for {
		keys, err := s.keyChunk(parts, after, lo, hi, chunk)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := fn(k); err != nil {
				if err == store.ErrStop {
					return nil
				}
				return err
			}
		}
		if len(keys) < chunk {
			return nil
		}
		last := keys[len(keys)-1]
		lo, after = last[:], true
		chunk = min(2*chunk, scanChunk)
	}
}

// keyChunk reads up to chunk keys k of the partitions parts with lo <= k
// (lo < k when after) and k < hi, in order (keyChunkSQL).
func (s *Store) keyChunk(parts []int16, after bool, lo, hi []byte, chunk int) ([]store.Key, error) {
	ctx, cancel := readCtx()
	defer cancel()
	q := keyChunkFromSQL
	if after {
		q = keyChunkAfterSQL
	}
	rows, err := s.pool.Query(ctx, sql(s.schema, q), lo, hi, chunk, partsArg(parts))
	if err != nil {
		return nil, fmt.Errorf("store: scan: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Key, error) {
		var b []byte
		if err := r.Scan(&b); err != nil {
			return store.Key{}, err
		}
		return toKey(b)
	})
	if err != nil {
		return nil, fmt.Errorf("store: scan: %w", err)
	}
	return keys, nil
}

// NextDue is the due time of the earliest stored message; see store.Store.
func (s *Store) NextDue() (int64, bool) { return s.nextDue(allParts) }

// nextDue is NextDue over the partitions parts.
func (s *Store) nextDue(parts []int16) (int64, bool) {
	if s.isClosed() || len(parts) == 0 {
		return 0, false
	}
	ctx, cancel := readCtx()
	defer cancel()
	var kb []byte
	err := s.pool.QueryRow(ctx, sql(s.schema, nextDueSQL), partsArg(parts)).Scan(&kb)
	if errors.Is(err, pgx.ErrNoRows) || s.isClosed() {
		return 0, false
	}
	k, kerr := toKey(kb)
	if err != nil || kerr != nil {
		// A failed read is not an empty store: something may be due from
		// the start (a caller's scan from there meets the error).
		return 0, true
	}
	return k.Due(), true
}

// List pages through one exchange's pending messages; see store.Store.
func (s *Store) List(vhost, exchange string, after store.Key, limit int, withBody bool) ([]*store.Message, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	d, ok := s.Exchange(vhost, exchange)
	if !ok {
		return nil, fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, exchange, vhost)
	}
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 10_000)
	cols := messageColumnsSQL
	if withBody {
		cols += ", body"
	}
	ctx, cancel := readCtx()
	defer cancel()
	rows, err := s.pool.Query(ctx, sql(s.schema, `SELECT `+cols+` FROM S.messages WHERE incarnation = $1 AND k > $2 ORDER BY k LIMIT $3`),
		d.Incarnation, after[:], limit)
	if err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*store.Message, error) { return scanMessage(rows, withBody) })
	if err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	return out, nil
}

// sumCounts reads the pending count of each live incarnation: the sum of
// its shard rows.
func (s *Store) sumCounts(where string, args ...any) (map[uint64]int64, error) {
	ctx, cancel := readCtx()
	defer cancel()
	rows, err := s.pool.Query(ctx, sql(s.schema, `SELECT c.incarnation, sum(c.n)::bigint FROM S.counts c
		JOIN S.exchanges e ON e.incarnation = c.incarnation `+where+` GROUP BY c.incarnation`), args...)
	if err != nil {
		return nil, err
	}
	out := map[uint64]int64{}
	var inc uint64
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&inc, &n}, func() error { out[inc] = n; return nil })
	return out, err
}

// Pending is the number of pending messages, read from the count rows of
// the live incarnations (a few rows per exchange, never the messages); 0
// when the database cannot be read.
func (s *Store) Pending() int64 {
	counts, err := s.sumCounts("")
	if err != nil {
		return 0
	}
	var n int64
	for _, c := range counts {
		n += c
	}
	return n
}

// Count is the number of pending messages of one exchange; see Pending.
func (s *Store) Count(vhost, exchange string) int64 {
	d, ok := s.Exchange(vhost, exchange)
	if !ok {
		return 0
	}
	counts, err := s.sumCounts("WHERE e.incarnation = $1", d.Incarnation)
	if err != nil {
		return 0
	}
	return counts[d.Incarnation]
}

// Counts lists every registered exchange with its pending count and the
// due time of its earliest pending message (one index probe each).
func (s *Store) Counts() []store.ExchangeCount {
	defs := s.Exchanges()
	counts, _ := s.sumCounts("")
	out := make([]store.ExchangeCount, 0, len(defs))
	ctx, cancel := readCtx()
	defer cancel()
	for _, d := range defs {
		c := store.ExchangeCount{VHost: d.VHost, Exchange: d.Name, Pending: counts[d.Incarnation]}
		if c.Pending > 0 {
			var kb []byte
			err := s.pool.QueryRow(ctx, sql(s.schema, `SELECT k FROM S.messages WHERE incarnation = $1 ORDER BY k LIMIT 1`), d.Incarnation).Scan(&kb)
			if k, kerr := toKey(kb); err == nil && kerr == nil {
				c.NextDue = k.Due()
			}
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b store.ExchangeCount) int {
		if a.VHost != b.VHost {
			if a.VHost < b.VHost {
				return -1
			}
			return 1
		}
		if a.Exchange < b.Exchange {
			return -1
		}
		if a.Exchange > b.Exchange {
			return 1
		}
		return 0
	})
	return out
}

// Upcoming counts the stored messages by due minute into ranges; see
// store.Store. It reads the tally rows of the minutes from bounds[0] to the
// last bound (a few rows per minute that holds messages) and those before
// bounds[0] (the overdue ones, few while release keeps up); what lies at
// or after the last bound is the total (the count rows) less the rest, so
// far-future messages cost nothing. Zeros when the database cannot be read.
func (s *Store) Upcoming(bounds []int64) []int64 {
	return s.upcoming(nil, bounds)
}

// upcoming is Upcoming over the partitions parts, nil: all.
func (s *Store) upcoming(parts []int16, bounds []int64) []int64 {
	out := make([]int64, len(bounds)+1)
	first, last := int64(0), int64(0)
	if len(bounds) > 0 {
		first, last = ceilMinute(bounds[0]), ceilMinute(bounds[len(bounds)-1])
	}
	ctx, cancel := readCtx()
	defer cancel()
	// The tally's shard says the partition; the counts' incarnation does.
	tallyIn, countsIn, args := "", "", []any{first, last}
	if parts != nil {
		tallyIn = fmt.Sprintf(" AND shard / %d = ANY($3)", shards)
		countsIn = " WHERE incarnation % " + strconv.Itoa(Partitions) + " = ANY($3)"
		args = append(args, parts)
	}
	rows, err := s.pool.Query(ctx, sql(s.schema, `
		SELECT minute, sum(n)::bigint FROM S.tally WHERE minute >= $1 AND minute < $2`+tallyIn+` GROUP BY minute
		UNION ALL SELECT -1, coalesce(sum(n), 0)::bigint FROM S.tally WHERE minute < $1`+tallyIn+`
		UNION ALL SELECT -2, coalesce(sum(n), 0)::bigint FROM S.counts`+countsIn), args...)
	if err != nil {
		return out
	}
	var minute, n, total, counted int64
	_, err = pgx.ForEachRow(rows, []any{&minute, &n}, func() error {
		switch minute {
		case -2:
			total = n
			return nil
		case -1:
			out[0] += n
		default:
			due := minute * 60_000
			i, _ := slices.BinarySearchFunc(bounds, due, func(b, t int64) int {
				if b <= t {
					return -1
				}
				return 1
			})
			out[i] += n
		}
		counted += n
		return nil
	})
	if err != nil {
		return make([]int64, len(bounds)+1)
	}
	out[len(bounds)] += total - counted
	return out
}

// ceilMinute is the first whole minute (in minutes since the epoch) whose
// start is at or after ms.
func ceilMinute(ms int64) int64 {
	m := ms / 60_000 // rounds toward zero: up for negative ms
	if ms%60_000 > 0 {
		m++
	}
	return m
}
