// Package releaser publishes due delayed messages to their real exchange in
// RabbitMQ, with publisher confirms, over the proxy's own account.
//
// It implements scheduler.Releaser. A message counts as released only when
// RabbitMQ has confirmed it (basic.ack); anything else (basic.nack, a closed
// channel or connection, a confirm that does not arrive in time) reports the
// message unconfirmed, and the scheduler retries it later. The store deletes a
// message only after its release was confirmed (invariant 2), so delivery is
// at-least-once.
//
// Invariants:
//
//   - One connection and one confirm-mode channel per virtual host, dialled
//     lazily and re-dialled after a failure. Messages of a batch are published
//     on that channel in the order given, so RabbitMQ routes them in release
//     order; batches for one vhost are published one after another, and their
//     confirms are awaited outside the lock so batches pipeline.
//   - A batch leaves in one socket write: the connection is corked while
//     amqp091-go publishes it (it flushes after every message) and uncorked
//     after. Bytes are never reordered; a failed write closes the connection,
//     so the confirms awaited fail and the batch is retried.
//   - What is published is the stored message: routing key, properties and
//     body as the client sent them, with the header x-delay set to minus the
//     delay (a signed 64-bit integer), as RabbitMQ's delayed-message plugin
//     does.
//   - Every release is published with mandatory set, so RabbitMQ returns what
//     no queue takes: those are counted and logged as unroutable, never
//     retried (RabbitMQ confirms a returned message after the return).
//     Alternate exchanges apply, since routing happens in RabbitMQ.
//   - When the real exchange is gone upstream (404 NOT_FOUND), the releaser
//     declares it again from the delayed exchange's definition in the
//     registry and the message is retried: the registry, not the broker, says
//     whether a delayed exchange exists. An exchange deleted through the
//     proxy has no registry entry and its messages are discarded by the
//     scheduler before they reach the releaser.
package releaser
