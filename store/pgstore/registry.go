package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/store"
)

// PutExchange records a delayed exchange; see store.Store. Every node
// hears of it (NOTIFY at commit).
func (s *Store) PutExchange(ctx context.Context, def *store.ExchangeDef) error {
	var inc uint64
	err := s.registryTx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sql(s.schema, `INSERT INTO S.exchanges
			(vhost, name, kind, delayed_type, durable, auto_delete, internal, arguments)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (vhost, name) DO UPDATE SET kind = EXCLUDED.kind, delayed_type = EXCLUDED.delayed_type,
				durable = EXCLUDED.durable, auto_delete = EXCLUDED.auto_delete, internal = EXCLUDED.internal,
				arguments = EXCLUDED.arguments
			RETURNING incarnation`),
			def.VHost, def.Name, int16(def.Kind), def.DelayedType, def.Durable, def.AutoDelete, def.Internal, nonNil(def.Arguments)).Scan(&inc)
	})
	if err != nil {
		return err
	}
	def.Incarnation = inc
	return nil
}

// DeleteExchange removes an exchange from the registry; see store.Store.
// The count returned leaves out messages of Puts that checked the
// incarnation before this commit and committed after it: they are stale
// and counted as such.
func (s *Store) DeleteExchange(ctx context.Context, vhost, name string) (int64, error) {
	var pending int64
	err := s.registryTx(ctx, func(tx pgx.Tx) error {
		var inc uint64
		err := tx.QueryRow(ctx, sql(s.schema, `DELETE FROM S.exchanges WHERE vhost = $1 AND name = $2 RETURNING incarnation`),
			vhost, name).Scan(&inc)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, name, vhost)
		}
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, sql(s.schema, `SELECT coalesce(sum(n), 0) FROM S.counts WHERE incarnation = $1`), inc).Scan(&pending)
	})
	return pending, err
}

// CancelExchange gives the exchange a new incarnation; see store.Store.
func (s *Store) CancelExchange(ctx context.Context, vhost, exchange string) (int64, error) {
	var pending int64
	err := s.registryTx(ctx, func(tx pgx.Tx) error {
		var old uint64
		err := tx.QueryRow(ctx, sql(s.schema, `WITH old AS (
				SELECT incarnation FROM S.exchanges WHERE vhost = $1 AND name = $2 FOR UPDATE)
			UPDATE S.exchanges e SET incarnation = nextval('S.incarnations') FROM old
			WHERE e.vhost = $1 AND e.name = $2 RETURNING old.incarnation`), vhost, exchange).Scan(&old)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q in vhost %q", store.ErrUnknownExchange, exchange, vhost)
		}
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, sql(s.schema, `SELECT coalesce(sum(n), 0) FROM S.counts WHERE incarnation = $1`), old).Scan(&pending)
	})
	return pending, err
}

// registryTx runs fn in a transaction that also notifies every node of a
// registry change, commits it, and reads the registry again so that this
// node's cache holds the change when the call returns.
func (s *Store) registryTx(ctx context.Context, fn func(pgx.Tx) error) error {
	s.closeMu.RLock() // Close waits for the call
	defer s.closeMu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel(registryChannel), s.node)
		return err
	})
	if err != nil {
		if errors.Is(err, store.ErrUnknownExchange) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("store: registry: %w", err)
	}
	if err := s.reload(ctx); err != nil {
		return fmt.Errorf("store: registry committed, reading it back failed: %w", err)
	}
	return nil
}

// nonNil is b, or an empty slice for nil: a NULL would not fit the NOT
// NULL columns.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
