// Package lease elects the node that holds a role (the releaser) among the
// delayproxy nodes of a cluster that share one PostgreSQL database: a lease
// with fencing, kept in a table of the store's schema.
//
// The table <schema>.releaser_lease has one row per role: the holder (a node
// id), an epoch bumped at every change of holder (the fencing token) and
// expires_at, read and written with the database's clock only. A node takes
// or renews the role with one statement that succeeds only when the row has
// expired or is already its own, so at most one node holds an unexpired
// lease at any moment of the database's time.
//
// # Invariants
//
//   - A node trusts the role only until the local deadline: the monotonic
//     time at which it SENT the renewal that succeeded, plus TTL, less
//     Margin. The database set expires_at to its own clock at the
//     statement's execution, which comes after the send, plus TTL, so the
//     local deadline passes before the database may hand the role to
//     another node. Held reads the clock at every call: a process stopped
//     (SIGSTOP) or starved past its deadline wakes up no longer holding the
//     role, although its TCP session, and any advisory lock, are intact.
//   - Run runs lead once per term (one acquisition, kept by renewals) and
//     ends the term at once when the local deadline passes or a renewal
//     finds another epoch; it waits for lead to return before it tries to
//     take the role again. Callers check Held before every action that
//     must happen only under the role (fencing).
//   - Takeover: a holder that dies, hangs or loses the database stops
//     renewing; others retry every Renew and take the role once expires_at
//     has passed: within TTL + Renew of the last renewal.
//
// Every goroutine Run starts is tracked and Run waits for it. The clock is
// passed in (scheduler.Clock); the expiry itself is the database's.
package lease
