package boltstore

import "github.com/delayproxy/delayproxy/store"

// Exchange looks a delayed exchange up in the in-memory registry.
func (s *Store) Exchange(vhost, name string) (store.ExchangeDef, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.exchanges[exKey{vhost, name}]
	d.Arguments = append([]byte(nil), d.Arguments...)
	return d, ok
}

// Exchanges lists the delayed exchanges in no particular order.
func (s *Store) Exchanges() []store.ExchangeDef {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]store.ExchangeDef, 0, len(s.exchanges))
	for _, d := range s.exchanges {
		d.Arguments = append([]byte(nil), d.Arguments...)
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
