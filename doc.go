// Package delayproxy wires one delayproxy instance: the AMQP side (amqpproxy,
// amqpproxy/wire, amqpproxy/delayed) in front of RabbitMQ, and the delay
// engine (store, scheduler, releaser) behind it, plus the HTTP side (admin,
// metrics). Config holds every setting with its default and Validate; New
// checks it and Run serves until its context ends.
//
// A delayed message flows one way:
//
//	client -> amqpproxy session -> delayed -> store -> scheduler -> releaser -> RabbitMQ
//
// One signal goes back against that flow: each release's lateness, from
// the scheduler to the intake gate (package intake), which slows the
// storing of new delayed publishes while releases run late.
//
// # Invariants
//
// The package docs cite these by number ("invariant 2"); each has tests.
//
//  1. A delayed publish is confirmed to the client only after it is durable
//     (fsync'd). If it cannot be stored, the client gets basic.nack (confirm
//     mode) or a channel error, never a silent drop.
//  2. A stored message is deleted only after RabbitMQ confirmed its release.
//     Delivery is at-least-once across crashes; duplicates are bounded by the
//     releases in flight and those awaiting their delete.
//  3. Never early: a message is released at or after its due wall-clock time.
//  4. Among messages that are due, higher AMQP priority goes first (no
//     priority = 0), then the earliest due, then publish order.
//     When releases keep up, each message goes at its due millisecond; when
//     they are behind (a burst, a backlog after downtime, a release rate),
//     everything due that the scheduler has loaded goes out by priority.
//     A release window (Config.ReleaseWindow) rounds due times up to a
//     multiple of it when a publish is taken, so that messages published
//     within one window with the same delay are due together.
//  5. Memory does not grow with the number of pending messages: only the
//     loaded horizon lives in RAM; the rest is in the store.
//  6. Restart is instant: opening a store with millions of pending messages
//     does not scan them all.
//  7. Frames that are not intercepted pass unchanged; field tables that are
//     not interpreted are forwarded as raw bytes. One exception, which
//     RabbitMQ settles alike: a consumer's acks written together may leave
//     as the last of them with multiple set (package amqpproxy, ackFloor).
package delayproxy
