package metrics

// RolesHeld records the number of releaser roles (partitions) this node
// holds now and how many it took or lost since the last call; a node with
// the bbolt store holds its one role from the start.
func (m *Metrics) RolesHeld(held, changes int) {
	if m == nil {
		return
	}
	m.roleChanges.Add(float64(changes))
	m.role.Set(float64(held))
}
