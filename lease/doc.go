// Package lease elects, for each partition of the messages, the node that
// holds its releaser role among the delayproxy nodes of a cluster that
// share one PostgreSQL database, and spreads the roles over the nodes:
// leases with fencing, kept in tables of the store's schema.
//
// The table <schema>.releaser_lease has one row per role (releaser/0 to
// releaser/<Partitions-1>): the holder (a node id), an epoch bumped at
// every change of holder (the fencing token) and expires_at, read and
// written with the database's clock only. A node takes a role with one
// statement that succeeds only when the row has expired (or is already
// its own), and renews only the rows it holds, so at most one node holds
// an unexpired lease of a role at any moment of the database's time.
// Statements that change several rows lock them in role order (no
// deadlock between nodes). The table <schema>.nodes has one row per node,
// its heartbeat, renewed with the roles for the same TTL: the live nodes
// are those whose row has not expired.
//
// # Spreading
//
// Each tick (Renew) a node counts the N live nodes; its share is
// ceil(Partitions/N). It takes expired roles while it holds fewer than its
// share, and any role that has stayed expired for longer than two renew
// intervals whatever its share (coverage first: every node has had its
// turn to read it by then). A node above its share,
// when no role is expired, gives one role up per tick: it stops using it
// at once (Held is false), and expires it in the database once the term
// that used it is over, for a node below its share to take. A graceful
// stop gives every role up at once and removes the node's heartbeat.
//
// # Invariants
//
//   - A node trusts a role only until its local deadline: the monotonic
//     time at which it SENT the take or renewal that succeeded, plus TTL,
//     less Margin. The database set expires_at to its own clock at the
//     statement's execution, which comes after the send, plus TTL, so the
//     local deadline passes before the database may hand the role to
//     another node. Held reads the clock at every call: a process stopped
//     (SIGSTOP) or starved past its deadlines wakes up holding no role,
//     although its TCP sessions are intact.
//   - Run runs lead once per term, a set of roles held; the term ends at
//     once when the set changes (a deadline passed, a renewal refused or
//     finding another epoch, a role taken or given up), and when one of
//     its roles was not held for a moment, even if it is taken again at
//     once (a deadline that passed before or during its renewal): its
//     ctx ends before the role is held again. Run keeps renewing while
//     lead returns, and starts the next term only after it has. Callers
//     check Held(p), then their term's ctx, before every action that must
//     happen only under role p (fencing): an action of a term that lost
//     the role cannot follow the term's refused ones once it is back.
//   - One round trip per tick (heartbeat, renewals, the expiry of a role
//     given up, and the reading of the roles and the live nodes, one
//     pipelined batch), a second when it takes roles.
//   - Takeover: a holder that dies, hangs or loses the database stops
//     renewing its roles and its heartbeat, which expire together; the
//     others count one node less, their share grows, and they take the
//     roles at their next tick: within TTL + Renew of the last renewal.
//
// Every goroutine Run starts is tracked and Run waits for it. The clock is
// passed in (scheduler.Clock); the expiries themselves are the database's.
package lease
