package lease

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The lease's statements. Every expiry is on the database's clock
// (clock_timestamp()); the local deadlines are kept by the caller.

// tickResult is what a tick read.
type tickResult struct {
	renewed map[int]int64 // the roles renewed, with their epochs
	roles   []roleState   // every role
	nodes   int           // live nodes, this one included
}

// exchange is a tick's round trip, one pipelined batch: the node's
// heartbeat, the renewal of the roles held, the expiry of those given up
// (expire), and the reading of every role and of the number of live nodes.
// Its time limit is the first local deadline while roles are held (a
// renewal answered later cannot keep them anyway), else the TTL.
func (l *Lease) exchange(ctx context.Context, sent time.Time, held []bool, expire []int) (*tickResult, error) {
	limit := l.cfg.TTL
	if d := l.firstDeadline(); !d.IsZero() {
		limit = max(d.Sub(sent), time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	ttl := l.cfg.TTL.Milliseconds()
	var renew []string
	for p, h := range held {
		if h {
			renew = append(renew, l.names[p])
		}
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO `+l.nodes+` (node, expires_at) VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond')
		ON CONFLICT (node) DO UPDATE SET expires_at = EXCLUDED.expires_at`, l.cfg.Holder, ttl)
	if len(renew) > 0 {
		b.Queue(`UPDATE `+l.roles+` AS l SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
			FROM (SELECT role FROM `+l.roles+` WHERE role = ANY($1) AND holder = $2 ORDER BY role FOR UPDATE) AS c
			WHERE l.role = c.role AND l.holder = $2 RETURNING l.role, l.epoch`, renew, l.cfg.Holder, ttl)
	}
	if len(expire) > 0 {
		b.Queue(l.expireSQL(), l.namesOf(expire), l.cfg.Holder)
	}
	b.Queue(`SELECT role, expires_at < clock_timestamp(), expires_at < clock_timestamp() - $2 * interval '1 millisecond',
			holder = $3 AND expires_at >= clock_timestamp(),
			(SELECT count(*) FROM `+l.nodes+` WHERE expires_at > clock_timestamp())
		FROM `+l.roles+` WHERE role = ANY($1)`, l.names, coverAfter*l.cfg.Renew.Milliseconds(), l.cfg.Holder)
	br := l.pool.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	res := &tickResult{renewed: map[int]int64{}, roles: make([]roleState, l.cfg.Partitions)}
	if len(renew) > 0 {
		var err error
		if res.renewed, err = l.readRoles(br); err != nil {
			return nil, err
		}
	}
	if len(expire) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, err
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	var role string
	var st roleState
	var nodes int
	_, err = pgx.ForEachRow(rows, []any{&role, &st.expired, &st.longExpired, &st.own, &nodes}, func() error {
		if p, ok := l.partition(role); ok {
			res.roles[p] = st
		}
		res.nodes = nodes
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, br.Close()
}

// take takes the roles parts, in one statement that takes each only if it
// has expired (or is this node's already), on the database's clock, and
// bumps its epoch when its holder changes; the rows are locked in role
// order. It returns the roles taken with their epochs.
func (l *Lease) take(ctx context.Context, parts []int) (map[int]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.TTL)
	defer cancel()
	rows, err := l.pool.Query(ctx, `UPDATE `+l.roles+` AS l SET holder = $2,
			epoch = CASE WHEN l.holder = $2 THEN l.epoch ELSE l.epoch + 1 END,
			expires_at = clock_timestamp() + $3 * interval '1 millisecond'
		FROM (SELECT role FROM `+l.roles+` WHERE role = ANY($1) ORDER BY role FOR UPDATE) AS c
		WHERE l.role = c.role AND (l.holder = $2 OR l.expires_at < clock_timestamp())
		RETURNING l.role, l.epoch`, l.namesOf(parts), l.cfg.Holder, l.cfg.TTL.Milliseconds())
	if err != nil {
		return nil, err
	}
	return l.collectRoles(rows)
}

// expireSQL expires the roles $1 that node $2 holds, locking them in role
// order as every statement that changes several roles does (no deadlock
// between nodes).
func (l *Lease) expireSQL() string {
	return `UPDATE ` + l.roles + ` AS l SET expires_at = clock_timestamp() - interval '1 millisecond'
		FROM (SELECT role FROM ` + l.roles + ` WHERE role = ANY($1) AND holder = $2 AND expires_at > clock_timestamp()
			ORDER BY role FOR UPDATE) AS c
		WHERE l.role = c.role AND l.holder = $2 AND l.expires_at > clock_timestamp()`
}

// leave gives up every role this node holds in the database and removes
// its heartbeat, so that the other nodes take its roles at once.
func (l *Lease) leave(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue(l.expireSQL(), l.names, l.cfg.Holder)
	b.Queue(`DELETE FROM `+l.nodes+` WHERE node = $1`, l.cfg.Holder)
	return l.pool.SendBatch(ctx, b).Close()
}

// readRoles reads the next result of br: rows of (role, epoch).
func (l *Lease) readRoles(br pgx.BatchResults) (map[int]int64, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	return l.collectRoles(rows)
}

// collectRoles reads rows of (role, epoch).
func (l *Lease) collectRoles(rows pgx.Rows) (map[int]int64, error) {
	out := map[int]int64{}
	var role string
	var epoch int64
	_, err := pgx.ForEachRow(rows, []any{&role, &epoch}, func() error {
		if p, ok := l.partition(role); ok {
			out[p] = epoch
		}
		return nil
	})
	return out, err
}

// namesOf names the roles parts.
func (l *Lease) namesOf(parts []int) []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = l.names[p]
	}
	return out
}

// partition is the partition of the role named role.
func (l *Lease) partition(role string) (int, bool) {
	s, ok := strings.CutPrefix(role, rolePrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(s)
	return p, err == nil && p >= 0 && p < l.cfg.Partitions
}
