package boltstore

import "github.com/delayproxy/delayproxy/store"

// Exchange looks a delayed exchange up in the in-memory registry. The
// definition shares its Arguments with the registry: read-only.
func (s *Store) Exchange(vhost, name string) (store.ExchangeDef, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{vhost, name}]
	return d, ok
}

// Exchanges lists the delayed exchanges in no particular order, their
// Arguments shared with the registry as Exchange's.
func (s *Store) Exchanges() []store.ExchangeDef {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]store.ExchangeDef, 0, len(s.exchanges))
	for _, d := range s.exchanges {
		out = append(out, d)
	}
	return out
}

// Stale reports whether m belongs to an exchange that was deleted or
// cancelled since m was stored. The scheduler deletes stale messages instead
// of releasing them.
func (s *Store) Stale(m *store.Message) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{m.VHost, m.Exchange}]
	return !ok || d.Incarnation != m.Incarnation
}
