package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/delayproxy/delayproxy/scheduler"
)

// Defaults of Config. A dead, hung or disconnected holder loses the role
// after at most DefaultTTL-DefaultMargin locally, and another node takes it
// within DefaultTTL+DefaultRenew of the holder's last renewal: under 2 s.
const (
	DefaultSchema = "delayproxy"
	DefaultRole   = "releaser"
	DefaultTTL    = 1500 * time.Millisecond
	DefaultRenew  = 300 * time.Millisecond
	DefaultMargin = 250 * time.Millisecond
)

// Config configures a Lease. The zero value of each field is its default.
type Config struct {
	// URL is the PostgreSQL connection string (libpq syntax; several hosts
	// and target_session_attrs=read-write included).
	URL string
	// Schema holds the table releaser_lease (the store's schema).
	Schema string
	// Role names the row of the table; one holder per role.
	Role string
	// Holder is this node's id; default NodeID().
	Holder string
	// TTL is how long a renewal keeps the role, on the database's clock.
	TTL time.Duration
	// Renew is the pause between renewals, and between attempts to take
	// the role when another node holds it.
	Renew time.Duration
	// Margin is taken off the local deadline for the clock rates of the
	// node and the database to differ.
	Margin time.Duration
	// Clock reads the local time the deadline is kept by; default the
	// system clock (monotonic).
	Clock scheduler.Clock
	// Logger receives the changes of holder and the database's errors.
	Logger *slog.Logger
	// Metrics receives the changes of role; nil is none.
	Metrics Metrics
}

// Metrics is what the lease reports; *metrics.Role has it.
type Metrics interface {
	// RoleHeld reports that this node took (true) or lost (false) the role.
	RoleHeld(held bool)
}

// Lease is one node's claim on a role. Open it, Run it.
type Lease struct {
	cfg   Config
	pool  *pgxpool.Pool
	table string // quoted schema.table
	log   *slog.Logger

	mu    sync.Mutex // guards until and epoch
	until time.Time  // local deadline of the role; zero when not held
	epoch int64      // the term's epoch while held

	beforeTry func() // tests: called before each attempt (blocks to pause the loop)
}

// NodeID is a node id unique across restarts: host name, process id and a
// random suffix.
func NodeID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + strconv.FormatUint(rand.Uint64()>>32, 36)
}

// Open connects to PostgreSQL and creates the schema and the lease table if
// they are missing. Its errors are one line each, fit for start-up.
func Open(ctx context.Context, cfg Config) (*Lease, error) {
	cfg = cfg.withDefaults()
	if cfg.Renew >= cfg.TTL-cfg.Margin {
		return nil, fmt.Errorf("lease: renew interval %v must be shorter than TTL %v less margin %v", cfg.Renew, cfg.TTL, cfg.Margin)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("lease: bad PostgreSQL URL: %w", err)
	}
	// A pool of its own, so that the store's load never delays a renewal.
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	l := &Lease{
		cfg:   cfg,
		pool:  pool,
		table: pgx.Identifier{cfg.Schema, "releaser_lease"}.Sanitize(),
		log:   cfg.Logger,
	}
	if err := l.createTable(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return l, nil
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Role == "" {
		c.Role = DefaultRole
	}
	if c.Holder == "" {
		c.Holder = NodeID()
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.Renew <= 0 {
		c.Renew = DefaultRenew
	}
	if c.Margin <= 0 {
		c.Margin = DefaultMargin
	}
	if c.Clock == nil {
		c.Clock = scheduler.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// createTable creates the schema and the table, as IF NOT EXISTS: the
// table is the lease's own, apart from the store's versioned migrations.
func (l *Lease) createTable(ctx context.Context) error {
	schema := pgx.Identifier{l.cfg.Schema}.Sanitize()
	for _, q := range []string{
		`CREATE SCHEMA IF NOT EXISTS ` + schema,
		`CREATE TABLE IF NOT EXISTS ` + l.table + ` (
			role       text PRIMARY KEY,
			holder     text NOT NULL,
			epoch      bigint NOT NULL,
			expires_at timestamptz NOT NULL
		)`,
	} {
		if _, err := l.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("lease: create %s: %w", l.table, err)
		}
	}
	return nil
}

// Close closes the connections. Call it after Run returned.
func (l *Lease) Close() { l.pool.Close() }

// Held reports whether this node holds the role now, by the local deadline
// (fencing): check it before every action only the holder may take.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.until.IsZero() && l.cfg.Clock.Now().Before(l.until)
}

// try takes or renews the role in one statement: it succeeds only when the
// role's row has expired or is this node's, on the database's clock, and
// then returns the epoch (bumped when the holder changes). ok is false when
// another node holds the role.
func (l *Lease) try(ctx context.Context) (epoch int64, ok bool, err error) {
	q := `INSERT INTO ` + l.table + ` AS l (role, holder, epoch, expires_at)
		VALUES ($1, $2, 1, clock_timestamp() + $3 * interval '1 millisecond')
		ON CONFLICT (role) DO UPDATE SET
			holder = EXCLUDED.holder,
			epoch = CASE WHEN l.holder = EXCLUDED.holder THEN l.epoch ELSE l.epoch + 1 END,
			expires_at = EXCLUDED.expires_at
		WHERE l.holder = EXCLUDED.holder OR l.expires_at < clock_timestamp()
		RETURNING epoch`
	err = l.pool.QueryRow(ctx, q, l.cfg.Role, l.cfg.Holder, l.cfg.TTL.Milliseconds()).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return epoch, err == nil, err
}

// release gives the role up in the database at once (a graceful stop), so
// that another node need not wait for the expiry.
func (l *Lease) release(ctx context.Context) error {
	_, err := l.pool.Exec(ctx, `UPDATE `+l.table+` SET expires_at = clock_timestamp() - interval '1 millisecond'
		WHERE role = $1 AND holder = $2`, l.cfg.Role, l.cfg.Holder)
	return err
}
