package metrics

// RoleHeld records that this node took (true) or lost (false) the releaser
// role; a node with the bbolt store takes it once, at start.
func (m *Metrics) RoleHeld(held bool) {
	if m == nil {
		return
	}
	m.roleChanges.Inc()
	if held {
		m.role.Set(1)
	} else {
		m.role.Set(0)
	}
}
