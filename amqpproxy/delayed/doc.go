// Package delayed makes exchanges of type x-delayed-message work through the
// proxy, as RabbitMQ's delayed-message-exchange plugin did, on a RabbitMQ
// that has no such plugin, and RabbitMQ 4.4's delivery-time headers on any
// exchange. Its Interceptor plugs into amqpproxy's seams.
//
// What it takes part in, per client connection:
//
//	exchange.declare type=x-delayed-message  -> checked as the plugin did
//	    (406 texts), declared upstream with the x-delayed-type as its type
//	    and the arguments unchanged, recorded in the store's registry after
//	    RabbitMQ's declare-ok; the client gets declare-ok after the record
//	    is durable (nothing for no-wait). A redeclare with another
//	    x-delayed-type goes upstream with the registered type, so RabbitMQ
//	    judges the flags and alternate-exchange; if it finds them
//	    equivalent, the proxy answers 406 naming x-delayed-type.
//	exchange.delete of a delayed exchange   -> relayed; after delete-ok the
//	    scheduler removes the record and discards (and counts) the pending
//	    messages; meanwhile Lookup hides the exchange from the releaser,
//	    which would otherwise declare it again on a release's 404.
//	basic.publish to a delayed exchange      -> x-delay parsed (parseDelay);
//	    none, zero or negative: relayed at once, header as it was; otherwise
//	    stored and confirmed with the client's own tag after fsync, once
//	    RabbitMQ said the user may publish there (Conn.CheckPublish).
//	basic.publish to any other exchange      -> with Config.DeliveryTimeHeaders,
//	    once its content header is in (InterceptsContent), and only when
//	    it carries headers: x-opt-delivery-time (unix ms) or
//	    x-opt-delivery-delay (ms) asking for a later time is stored like a
//	    delayed publish, under a registry entry of kind KindDeliveryTime
//	    (registered by the exchange's first such publish), with Delay 0 so
//	    that it is released with its properties unchanged; anything else
//	    is relayed as it was (deliverytime.go).
//	exchange.delete of such an exchange      -> relayed only: its pending
//	    messages stay, and meet the exchange (or its absence) at release.
//	tx.commit / tx.rollback                  -> a transaction's delayed
//	    publishes are stored before tx.commit goes upstream, withdrawn if
//	    RabbitMQ does not commit, dropped at tx.rollback.
//
// Invariants (the numbers are those of package delayproxy's list):
//
//   - A delayed publish is acknowledged only after Store.Put returned (the
//     commit holding it is fsync'd); a failed Put is a basic.nack in
//     confirm mode and a 506 channel error otherwise. Nothing is dropped
//     silently (invariant 1).
//   - The proxy releases with its own account, so it is no way around
//     RabbitMQ's permissions: before a delayed publish is stored (or kept
//     with a transaction), RabbitMQ judges the publishing user's write
//     permission on the exchange, and topic permission on the routing key
//     for topic exchanges (Conn.CheckPublish). A refusal closes the channel
//     with RabbitMQ's own 403 and text; nothing is stored.
//   - A delayed publish looks the registry up once, when it is intercepted;
//     the record goes with it through the permission check to Put, and the
//     message carries its Incarnation, so a publish aimed at an exchange
//     deleted or re-created meanwhile is refused by the store, never filed
//     under the new one.
//   - One storer goroutine per connection stores its publishes in the order
//     the client sent them, batching what queued up while its Puts (two at
//     most) were in flight. It queues each Put to the store itself
//     (PutAsync), so a later Put's messages take later sequences and equal
//     due times keep publish order (invariant 4). Its queue is bounded;
//     reading from the client stops while it is full.
//   - Due times are the publish time rounded up to the millisecond plus
//     x-delay (DueAt): the time its last bytes reached this host, as the
//     kernel tells it (Publish.Received, Linux), never before it was
//     sent, or else when the proxy took it (publishedAt). Then up to a
//     multiple of Config.ReleaseWindow when
//     one is set (windowDue), so no release is ever early as seen from the
//     client (invariant 3), and messages published within one window with
//     the same delay are due together (invariant 4).
//   - A publish to an exchange this connection is still declaring waits for
//     the declare's outcome, so a no-wait declare followed at once by a
//     publish is still delayed.
//   - Every goroutine it starts is tracked; Wait returns when all taken
//     publishes are answered and registry updates are done.
//
// Its Store, Scheduler and Metrics are interfaces declared here, each the
// few methods the layer calls.
package delayed
