package lease

// coverAfter is how many renew intervals a role stays expired before any
// node takes it whatever its share. Every node reads the roles once per
// interval, at its own phase, and a loaded one later: after one interval
// the node whose share has room may not have had its turn yet, and a node
// at its share taking the role then makes another node's share uneven (in
// the e2e tests it took two roles of a killed node that the other survivor
// was about to take, then gave them back one per tick, restarting its
// scheduler each time). After two, no node with room took it.
const coverAfter = 2

// roleState is one role as a tick read it from the database.
type roleState struct {
	expired     bool // expires_at has passed
	longExpired bool // for longer than coverAfter renew intervals: no node took it
	// own: this node holds it in the database, unexpired, although not by
	// its local deadline (lost: it passed before or during the renewal).
	own bool
}

// share is how many roles a node may hold among nodes live ones (itself
// included): ceil(roles/nodes), so that the shares cover every role.
func share(roles, nodes int) int {
	nodes = max(nodes, 1)
	return (roles + nodes - 1) / nodes
}

// plan decides what a node does at a tick. held and leaving are this
// node's roles (held by the local deadline) and those it gave up and has
// not yet expired in the database; roles is what the tick read; nodes the
// live nodes it counted. The node takes expired roles, and its own that it
// lost locally (own), while it holds fewer than its share, and any role
// expired for longer than coverAfter renew intervals whatever its share
// (coverage first); a node above its share, when no role is expired and it
// is giving none up, gives up one: giveUp, else -1.
func plan(held, leaving []bool, roles []roleState, nodes int) (take []int, giveUp int) {
	n := 0
	for _, h := range held {
		if h {
			n++
		}
	}
	s := share(len(roles), nodes)
	anyExpired, anyLeaving := false, false
	for p, r := range roles {
		anyExpired = anyExpired || r.expired
		anyLeaving = anyLeaving || leaving[p]
	}
	// The roles nobody took for a while first, then in order.
	for _, long := range []bool{true, false} {
		for p, r := range roles {
			if held[p] || leaving[p] || !(r.expired || r.own) || r.longExpired != long {
				continue
			}
			if long || n+len(take) < s {
				take = append(take, p)
			}
		}
	}
	giveUp = -1
	if len(take) == 0 && n > s && !anyExpired && !anyLeaving {
		for p := len(held) - 1; p >= 0; p-- {
			if held[p] {
				giveUp = p
				break
			}
		}
	}
	return take, giveUp
}
