package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openTimeout bounds Open's connection and migration when ctx has no
// deadline.
const openTimeout = 15 * time.Second

// shards is how many count and tally rows one exchange incarnation and one
// minute may have: each Open picks one at random and writes only to it, so
// that nodes do not queue on each other's row locks.
const shards = 16

// Open connects to the PostgreSQL database at connURL (a postgres:// URL
// or libpq key=value string: several hosts and target_session_attrs
// included), creates or migrates the schema Options.Schema, loads the
// registry and starts the writer and the listener. Its errors are one line
// each and never show the URL's password.
func Open(ctx context.Context, connURL string, opts Options) (*Store, error) {
	opts, err := opts.normalize()
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	where := redact(connURL)
	cfg, err := pgxpool.ParseConfig(connURL)
	if err != nil {
		return nil, fmt.Errorf("store %s: not a valid PostgreSQL URL: %s", where, parseCause(err))
	}
	// Operators see the store's sessions in pg_stat_activity by name.
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "delayproxy"
	}
	// The committers, the listener's reloads and the reads each hold a
	// connection at times.
	cfg.MaxConns = max(cfg.MaxConns, int32(opts.Committers+4))
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, openTimeout)
		defer cancel()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store %s: cannot connect: %s", where, oneLine(err.Error()))
	}
	if err := migrate(ctx, pool, opts.Schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store %s: %s", where, err)
	}
	s := &Store{
		pool:    pool,
		connCfg: cfg.ConnConfig,
		opts:    opts,
		schema:  opts.Schema,
		shard:   int16(rand.IntN(shards)),
		node:    fmt.Sprintf("%016x", rand.Uint64()),
		reqs:    make(chan *request, 4*1024),
		dead:    map[uint64]bool{},
	}
	// The listener listens before Open returns, so that no change after
	// the registry's reading goes unheard.
	conn, err := s.dialListener(ctx)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("store %s: listen: %s", where, err)
	}
	if err := s.reload(ctx); err != nil {
		_ = conn.Close(context.Background())
		pool.Close()
		return nil, fmt.Errorf("store %s: read the registry: %s", where, err)
	}
	var autovacuum string
	if err := pool.QueryRow(ctx, `SHOW autovacuum`).Scan(&autovacuum); err == nil && autovacuum != "on" {
		opts.Logger.Warn("store: the server runs with autovacuum off: the rows of released messages are not reclaimed and the messages table grows until VACUUM runs", "schema", opts.Schema)
	}
	s.stopCtx, s.stopListen = context.WithCancel(context.Background())
	s.wg.Go(s.writer)
	s.wg.Go(func() { s.listen(conn) })
	return s, nil
}

// redact is the URL with its password replaced, for error messages; a
// string that is no URL (libpq key=value) is reduced to "the database".
func redact(connURL string) string {
	u, err := url.Parse(connURL)
	if err != nil || u.Scheme == "" {
		return "(the database)"
	}
	return u.Redacted()
}

// parseCause is the reason pgx gives for a URL it cannot parse, without
// the URL (pgconn.ParseConfigError repeats it, password masked only on a
// best-effort basis).
func parseCause(err error) string {
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		// "cannot parse `URL`: cause": the cause alone.
		if _, cause, ok := strings.Cut(msg, "`: "); ok {
			return oneLine(cause)
		}
		return "cannot parse it"
	}
	return oneLine(msg)
}

// oneLine joins the lines of an error message (pgconn lists one line per
// host it tried).
func oneLine(msg string) string {
	msg = strings.ReplaceAll(msg, ":\n\t", ": ")
	msg = strings.ReplaceAll(msg, "\n\t", "; ")
	return strings.ReplaceAll(msg, "\n", " ")
}
