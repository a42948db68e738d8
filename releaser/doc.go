// Package releaser publishes due delayed messages to their real exchange in
// RabbitMQ, with publisher confirms, over the proxy's own account. It
// implements scheduler.PipelinedReleaser and speaks AMQP 0-9-1 itself, with
// the codec of amqpproxy/wire.
//
// # Contract
//
//   - A message counts as released only when RabbitMQ acked it (basic.ack).
//     A nack, a channel or connection that ends, or a confirm that does not
//     come within ConfirmTimeout reports it unconfirmed, and the scheduler
//     retries it. The store deletes a message only after that ack
//     (invariant 2 of package delayproxy): delivery is at-least-once.
//   - Order: one connection and one confirm-mode channel per vhost. The
//     messages of a batch are written in the order given, and batches one
//     after another, so RabbitMQ routes them in release order; confirms are
//     awaited apart, so batches pipeline. After a failed publish (no
//     connection, a connection lost with releases in flight), the vhost's
//     next batches are refused for 50 ms, so they cannot overtake the
//     failed one, which the scheduler retries first; Publish reports each
//     refusal, and the scheduler then holds back its later batches itself
//     until it has the refused ones back.
//   - What is released is the stored message: routing key, properties and
//     body as the client sent them. Only the header x-delay is set, to
//     minus the delay (not for a delivery-time message, Delay 0); every other byte of the properties is the client's,
//     headers in their order with their types. x-delay is a signed 64-bit
//     'l' (RabbitMQ 3.13 and later), or with DelayInt32 a signed 32-bit 'I'
//     (the plugin up to 3.12) when the value fits.
//   - Every release is mandatory: what no queue takes RabbitMQ returns, and
//     it is counted and logged as unroutable, never retried (RabbitMQ acks
//     a returned message after the return). Alternate exchanges apply, since
//     routing happens in RabbitMQ.
//   - When the real exchange is gone upstream (channel.close 404 NOT_FOUND),
//     the releaser declares it again from the registry's definition,
//     arguments byte for byte, and the message is retried: the registry, not
//     the broker, says whether a delayed exchange exists.
//   - An exchange of delivery-time messages (store.KindDeliveryTime) is
//     never declared: after a release to it met 404, it is checked with a
//     passive exchange.declare before each retry, and its messages are
//     dropped (reported confirmed) and counted and logged as unroutable
//     once MissingChecks checks in a row found it missing.
//   - Delivery-time messages (Delay 0) are released with the client's
//     properties byte for byte: no x-delay is set.
//   - A stored record that can never be released (properties that do not
//     parse, a content header over frame_max) is logged and reported
//     confirmed, so it leaves the store.
//
// # On the wire
//
// Each connection: protocol header; connection.start / start-ok (PLAIN,
// connection_name "<Name> <vhost>"); tune / tune-ok with RabbitMQ's
// channel_max and frame_max and the shorter heartbeat; connection.open on
// the vhost; channel.open and confirm.select on channel 1. Channel 2 is
// opened only to declare an exchange again. A batch is one socket write
// (writev when large bodies are written from their messages): per release,
// on channel 1,
//
//	method   01 0001 size | 003C 0028  0000  exchange  routing-key  01         | CE
//	                        basic.publish     shortstr  shortstr     mandatory
//	header   02 0001 size | 003C 0000  body-size (u64)  client's properties*  | CE
//	body     03 0001 size | up to frame_max-8 bytes of the body                | CE
//	...      (as many body frames as the body needs; none for an empty body)
//
//	* the client's flags and property list, with the headers table's
//	  x-delay entry replaced in place, or the table rewritten around it
//	  when the value's width changes ('I' to 'l'):
//	  07 "x-delay" 'l' FFFFFFFFFFFFFA24   (-1500)
//
// One reader goroutine per connection takes what RabbitMQ sends: acks and
// nacks (multiple or not), basic.return and its content, channel.close and
// connection.close (answered with close-ok; the connection is then closed),
// connection.blocked and unblocked. A connection that ends while idle is
// dialled again at once in the background (after 100 ms when it lived
// under a second), then after 200 ms, 400 ms and so on up to every 30 s
// while that fails, so that the next release finds it open; one that ends with releases in flight is dialled again by the
// release path, after the failed batch is retried. A connection is dialled
// by whoever needs it first (a release, Warm, a redial); whoever asks for
// the same vhost meanwhile waits for that dial, and no other vhost's
// releases do.
// A heartbeat goroutine sends a heartbeat when nothing was written for half
// the interval, and ends the connection when nothing arrived for two. Close
// sends connection.close and waits for every goroutine the Releaser started.
package releaser
