package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/store"
)

// reload reads the whole registry and replaces the cache with it, unless a
// reload that started later has already replaced it (its snapshot is the
// newer one).
func (s *Store) reload(ctx context.Context) error {
	gen := s.regGen.Add(1)
	rows, err := s.pool.Query(ctx, sql(s.schema, `SELECT vhost, name, kind, delayed_type, durable, auto_delete, internal,
		arguments, incarnation FROM S.exchanges`))
	if err != nil {
		return err
	}
	m := map[exKey]store.ExchangeDef{}
	var d store.ExchangeDef
	var kind int16
	_, err = pgx.ForEachRow(rows, []any{&d.VHost, &d.Name, &kind, &d.DelayedType, &d.Durable, &d.AutoDelete, &d.Internal,
		&d.Arguments, &d.Incarnation}, func() error {
		d.Kind = store.ExchangeKind(kind)
		m[exKey{d.VHost, d.Name}] = d
		d.Arguments = nil // the next row gets its own slice
		return nil
	})
	if err != nil {
		return err
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if gen > s.regApplied {
		s.exchanges, s.regApplied = m, gen
	}
	return nil
}

// Exchange looks a delayed exchange up in this node's cache of the
// registry: this node's changes are in it when they return, other nodes'
// as soon as their notification arrives (or the periodic reload runs).
func (s *Store) Exchange(vhost, name string) (store.ExchangeDef, bool) {
	s.regMu.RLock()
	defer s.regMu.RUnlock()
	d, ok := s.exchanges[exKey{vhost, name}]
	return d, ok
}

// Exchanges lists the cached registry; see Exchange.
func (s *Store) Exchanges() []store.ExchangeDef {
	s.regMu.RLock()
	defer s.regMu.RUnlock()
	out := make([]store.ExchangeDef, 0, len(s.exchanges))
	for _, d := range s.exchanges {
		out = append(out, d)
	}
	return out
}

// Stale reports whether m's incarnation is no longer live. The cache
// answers when it knows better (m's incarnation is the live one, or older
// than it: incarnations of a name only grow); when m is newer than the
// cache, or its exchange unknown to it, another node may have changed the
// registry unheard yet, and the database answers. An incarnation found
// dead there is remembered (it never lives again), so discarding the
// messages of a deleted exchange reads the registry once. When the
// database cannot answer, m is not stale: a release too many rather than
// a message lost.
func (s *Store) Stale(m *store.Message) bool {
	s.regMu.RLock()
	d, ok := s.exchanges[exKey{m.VHost, m.Exchange}]
	dead := s.dead[m.Incarnation]
	s.regMu.RUnlock()
	switch {
	case dead:
		return true
	case ok && m.Incarnation <= d.Incarnation:
		return m.Incarnation != d.Incarnation
	}
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	if err := s.reload(ctx); err != nil {
		return false
	}
	s.regMu.Lock()
	defer s.regMu.Unlock()
	if d, ok := s.exchanges[exKey{m.VHost, m.Exchange}]; ok && d.Incarnation == m.Incarnation {
		return false
	}
	s.dead[m.Incarnation] = true
	return true
}
