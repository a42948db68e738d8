package lease

import (
	"context"
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

// Defaults of Config. A dead, hung or disconnected holder loses its roles
// after at most DefaultTTL-DefaultMargin locally, and another node takes
// them within DefaultTTL+DefaultRenew of the holder's last renewal: under
// 2 s.
const (
	DefaultSchema = "delayproxy"
	DefaultTTL    = 1500 * time.Millisecond
	DefaultRenew  = 300 * time.Millisecond
	DefaultMargin = 250 * time.Millisecond
)

// rolePrefix names the roles: releaser/0, releaser/1, ...
const rolePrefix = "releaser/"

// legacyRole is the one role of delayproxy before partitions, fenced off
// by legacyHolder (Open).
const (
	legacyRole   = "releaser"
	legacyHolder = "(releaser roles per partition)"
)

// Config configures a Lease. The zero value of each field but Partitions
// is its default.
type Config struct {
	// URL is the PostgreSQL connection string (libpq syntax; several hosts
	// and target_session_attrs=read-write included).
	URL string
	// Schema holds the tables releaser_lease and nodes (the store's schema).
	Schema string
	// Partitions is the number of roles: releaser/0 to
	// releaser/<Partitions-1>, one per partition of the messages.
	Partitions int
	// Holder is this node's id; default NodeID().
	Holder string
	// TTL is how long a renewal keeps a role, and a heartbeat the node
	// counted live, on the database's clock.
	TTL time.Duration
	// Renew is the pause between ticks: renewals, heartbeats and attempts
	// to take roles.
	Renew time.Duration
	// Margin is taken off the local deadline for the clock rates of the
	// node and the database to differ.
	Margin time.Duration
	// Clock reads the local time the deadlines are kept by; default the
	// system clock (monotonic).
	Clock scheduler.Clock
	// Logger receives the changes of roles and the database's errors.
	Logger *slog.Logger
	// Metrics receives the changes of roles; nil is none.
	Metrics Metrics
}

// Metrics is what the lease reports; *metrics.Metrics has it.
type Metrics interface {
	// RolesHeld reports the number of roles this node holds now and how
	// many it took or lost since the last report.
	RolesHeld(held, changes int)
}

// Lease is one node's claim on the releaser roles. Open it, Run it.
type Lease struct {
	cfg   Config
	pool  *pgxpool.Pool
	roles string // quoted schema.releaser_lease
	nodes string // quoted schema.nodes
	names []string
	log   *slog.Logger

	mu    sync.Mutex  // guards until and epoch
	until []time.Time // per role, the local deadline; zero when not held
	epoch []int64     // per role, the epoch while held

	beforeTick func() // tests: called before each tick (blocks to pause the loop)
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

// Open connects to PostgreSQL and creates the schema, the lease's tables
// and the rows of the roles if they are missing. Its errors are one line
// each, fit for start-up.
func Open(ctx context.Context, cfg Config) (*Lease, error) {
	cfg = cfg.withDefaults()
	if cfg.Partitions <= 0 {
		return nil, fmt.Errorf("lease: %d partitions: want at least 1", cfg.Partitions)
	}
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
		roles: pgx.Identifier{cfg.Schema, "releaser_lease"}.Sanitize(),
		nodes: pgx.Identifier{cfg.Schema, "nodes"}.Sanitize(),
		log:   cfg.Logger,
		until: make([]time.Time, cfg.Partitions),
		epoch: make([]int64, cfg.Partitions),
	}
	for p := range cfg.Partitions {
		l.names = append(l.names, rolePrefix+strconv.Itoa(p))
	}
	if err := l.createTables(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return l, nil
}

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
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

// createTables creates the schema, the tables and the roles' rows (held
// by no one), as IF NOT EXISTS: the tables are the lease's own, apart from
// the store's versioned migrations. It forgets the nodes dead for an hour.
func (l *Lease) createTables(ctx context.Context) error {
	schema := pgx.Identifier{l.cfg.Schema}.Sanitize()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`CREATE SCHEMA IF NOT EXISTS ` + schema, nil},
		{`CREATE TABLE IF NOT EXISTS ` + l.roles + ` (
			role       text PRIMARY KEY,
			holder     text NOT NULL,
			epoch      bigint NOT NULL,
			expires_at timestamptz NOT NULL
		)`, nil},
		{`CREATE TABLE IF NOT EXISTS ` + l.nodes + ` (
			node       text PRIMARY KEY,
			expires_at timestamptz NOT NULL
		)`, nil},
		{`INSERT INTO ` + l.roles + ` (role, holder, epoch, expires_at)
			SELECT r, '', 0, '-infinity' FROM unnest($1::text[]) AS r ON CONFLICT (role) DO NOTHING`, []any{l.names}},
		{`DELETE FROM ` + l.nodes + ` WHERE expires_at < clock_timestamp() - interval '1 hour'`, nil},
		// The one role of the whole cluster of older delayproxy versions
		// is held for ever by no node: an older node still running loses
		// it at its next renewal, and none takes it again.
		{`INSERT INTO ` + l.roles + ` (role, holder, epoch, expires_at) VALUES ($1, $2, 1, 'infinity')
			ON CONFLICT (role) DO UPDATE SET holder = EXCLUDED.holder, epoch = ` + l.roles + `.epoch + 1, expires_at = 'infinity'
			WHERE ` + l.roles + `.holder <> EXCLUDED.holder`, []any{legacyRole, legacyHolder}},
	} {
		if _, err := l.pool.Exec(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("lease: create %s: %w", l.roles, err)
		}
	}
	return nil
}

// Close closes the connections. Call it after Run returned.
func (l *Lease) Close() { l.pool.Close() }

// Held reports whether this node holds role p now, by its local deadline
// (fencing): check it before every action only the holder may take.
func (l *Lease) Held(p int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return p >= 0 && p < len(l.until) && !l.until[p].IsZero() && l.cfg.Clock.Now().Before(l.until[p])
}

// heldSet lists the roles held now by their local deadlines.
func (l *Lease) heldSet() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Clock.Now()
	var out []int
	for p, u := range l.until {
		if !u.IsZero() && now.Before(u) {
			out = append(out, p)
		}
	}
	return out
}
