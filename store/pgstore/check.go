package pgstore

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/store"
)

// Check verifies the count rows against the messages (per incarnation),
// the tally against their due minutes, every node's rows summed, and that
// every message is in its exchange's partition under a key that says it.
// It reads every message: for tests and operators, not for a busy store.
func (s *Store) Check() error {
	if s.isClosed() {
		return store.ErrClosed
	}
	ctx, cancel := readCtx()
	defer cancel()
	for _, c := range []struct{ what, bad, q string }{
		{"counts", "counts of %d are %d, the messages %d", `WITH c AS (SELECT incarnation AS g, sum(n)::bigint AS n FROM S.counts GROUP BY incarnation),
			m AS (SELECT incarnation AS g, count(*) AS n FROM S.messages GROUP BY incarnation)
			SELECT coalesce(c.g, m.g), coalesce(c.n, 0), coalesce(m.n, 0) FROM c FULL JOIN m ON c.g = m.g
			WHERE coalesce(c.n, 0) <> coalesce(m.n, 0)`},
		{"tally", "tally of minute %d is %d, the messages %d", `WITH c AS (SELECT minute AS g, sum(n)::bigint AS n FROM S.tally GROUP BY minute),
			m AS (SELECT (('x' || encode(substr(k, 1, 8), 'hex'))::bit(64)::bigint) / 60000 AS g, count(*) AS n
				FROM S.messages GROUP BY 1)
			SELECT coalesce(c.g, m.g), coalesce(c.n, 0), coalesce(m.n, 0) FROM c FULL JOIN m ON c.g = m.g
			WHERE coalesce(c.n, 0) <> coalesce(m.n, 0)`},
		{"partition", "a message of incarnation %d is in partition %d under a key of partition %d", `SELECT incarnation, part, get_byte(k, 16) % 8 FROM S.messages
			WHERE part <> incarnation % 8 OR part <> get_byte(k, 16) % 8`},
	} {
		rows, err := s.pool.Query(ctx, sql(s.schema, c.q))
		if err != nil {
			return fmt.Errorf("store: check %s: %w", c.what, err)
		}
		var g, kept, real int64
		var bad error
		_, err = pgx.ForEachRow(rows, []any{&g, &kept, &real}, func() error {
			if bad == nil {
				bad = fmt.Errorf("store: check: "+c.bad, g, kept, real)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: check %s: %w", c.what, err)
		}
		if bad != nil {
			return bad
		}
	}
	return nil
}
