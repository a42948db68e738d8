package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/delayproxy/delayproxy/store"
)

// A commit whose connection failed after the commit was sent is in doubt:
// PostgreSQL may have committed it (a server stopped or a primary killed
// just after the commit record, which a synchronous standby may already
// hold). Answering its Puts with an error would nack messages that are
// stored and will be released. So the writer asks, on a new connection
// (the new primary, with target_session_attrs=read-write), whether the
// batch's messages are there: the transaction is atomic, so one is enough.

// resolveRetry is the pause between two reads that resolve a commit in
// doubt while the database is unreachable.
const resolveRetry = 100 * time.Millisecond

// resolveInDoubt returns nil when the batch c tried to commit is stored
// after all, else err. It keeps err when nothing was sent (SafeToRetry, or
// no connection was made), when the batch has no Put, and when no read
// answers within commitTimeout.
func (s *Store) resolveInDoubt(c *commit, err error) error {
	var ce *pgconn.ConnectError
	if err == nil || pgconn.SafeToRetry(err) || errors.As(err, &ce) {
		return err
	}
	var keys []store.Key
	for _, r := range c.reqs {
		if r.kind == opPut && c.refused[r] == nil {
			for _, m := range r.msgs {
				keys = append(keys, m.Key)
			}
		}
	}
	if len(keys) == 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(s.stopCtx, commitTimeout)
	defer cancel()
	for {
		var found bool
		qerr := s.pool.QueryRow(ctx, sql(s.schema, `SELECT EXISTS (SELECT 1 FROM S.messages WHERE `+byKeysSQL+`)`), keysArg(keys)...).Scan(&found)
		switch {
		case qerr == nil && found:
			s.opts.Logger.Warn("store: a commit in doubt was committed", "messages", len(keys), "err", err)
			return nil
		case qerr == nil:
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(resolveRetry):
		}
	}
}
