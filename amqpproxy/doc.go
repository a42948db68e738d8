// Package amqpproxy is the AMQP 0-9-1 side of delayproxy: a transparent
// proxy that relays each client connection to its own connection to
// RabbitMQ, frame by frame, and lets an Interceptor (the delayed-exchange
// layer, package delayed) take part in chosen traffic.
//
//	srv, err := amqpproxy.New(amqpproxy.Config{Upstream: "amqp://rabbitmq:5672", Interceptor: nil})
//	go srv.ListenAndServe(":5673")
//	...
//	srv.Shutdown(ctx) // confirms owed, then 320 CONNECTION_FORCED to every client; wait
//
// # Invariants
//
// The numbers are those of package delayproxy's list.
//
//   - Frames that are not intercepted pass unchanged (invariant 7): the
//     proxy peeks at the method id (4 bytes) and decodes only what it must
//     act on (channel lifecycle, confirm and tx select, basic.ack/nack from
//     RabbitMQ, and the methods an Interceptor asks for). Client
//     properties, tables and content headers go through byte for byte.
//   - The exception: consumer acks that leave in one write, each settling
//     the lowest unsettled delivery of its channel, go upstream as the
//     last of them with multiple set (ackfold.go), which settles the same
//     deliveries with one message to the queue. Whatever ackFloor cannot
//     follow (no-ack consumers, tx, recover, tags it has not relayed)
//     stops the folding on that channel; RabbitMQ refuses what it would.
//   - Clients are greeted with RabbitMQ's own connection.start: the proxy
//     dials RabbitMQ on the client's protocol header, and passes on its
//     server properties byte for byte with one key added ("delayproxy" =>
//     Config.Version), its protocol version and locales, and those of its
//     mechanisms the proxy relays (PLAIN, AMQPLAIN). See greeting.go.
//   - Both hops are tuned alike: the client is offered RabbitMQ's own tune
//     values (but the heartbeat: Config.Heartbeat's, 0 for none), and
//     RabbitMQ gets the client's tune-ok as it is, so every channel number
//     RabbitMQ allows is the client's. Bodies are re-split when a frame
//     would exceed a hop's frame_max; header frames are never split.
//   - No frame is put inside another message's frames on the same channel:
//     each writer follows the contents it writes per channel and holds the
//     proxy's own frames for a channel (confirms, replies, channel.close)
//     until the content in progress there is complete.
//   - Errors are RabbitMQ's: what RabbitMQ can judge is relayed and judged by
//     it (its connection.close reaches the client); what the proxy must judge
//     itself (framing, content it assembles) gets the code and wording
//     RabbitMQ 3.10 uses. Handshake
//     errors close the socket without a word, as RabbitMQ does; a refused
//     login or vhost is RabbitMQ's own answer, relayed.
//   - Graceful shutdown loses no confirm (the proxy's half of invariant 1):
//     Server.Shutdown stops taking methods from each client, waits until
//     every publish handed to the hooks is answered and every confirm owed
//     on an open channel is written, and only then sends connection.close
//     320 (a client that republishes unconfirmed messages would duplicate
//     the others).
//   - Memory is bounded per connection: each writer queue holds at most
//     Config.WriteQueueBytes of relayed frames (plus one frame); a reader that
//     finds its peer's queue full stops reading its socket, so a slow reader
//     on either side slows the other through TCP.
//
// # Goroutines and ownership
//
// Per client connection (a session), four goroutines, all waited for by
// Server.Close and Shutdown:
//
//	client socket                                         RabbitMQ socket
//	  --read--> [handler: handshake, then client reader] --queue--> [upstream writer] --write-->
//	 <--write-- [client writer] <--queue-- [upstream reader] <--read--
//
// The handler goroutine (Server.handle) runs the handshake synchronously on
// both sockets, then starts the writers and the upstream reader, runs the
// client reader, and returns only after the other three have exited. Each
// writer owns its socket's write side (a wire.Writer): it drains its queue,
// flushes when the queue is empty (batching without a timer), sends a
// heartbeat when it wrote nothing for half the heartbeat interval, and
// closes the socket when it exits, which ends the reader of that socket.
// A reader queues the frames it relays without waking the writer and
// wakes it once it has no whole frame left buffered, so the frames of one
// socket read leave in one write; it also wakes it before every hook
// call and before it waits for room, so nothing it queued waits on it.
// Readers set a read deadline of two heartbeat intervals before every read
// (any byte counts as liveness; time spent blocked on a full queue does
// not count against the peer). A dead upstream gets the client a
// connection.close 320 CONNECTION_FORCED with the reason; a dead client
// takes its upstream connection down. Channel 0 is handled alike on both
// hops: a connection.close from either side is relayed, and its close-ok
// ends the session.
//
// Channel state (Channel) is split by owner: the client reader owns the
// client content in progress (ch.in), the upstream reader the upstream one
// (ch.up), each writer its view of the channel on its hop (toClient,
// toUpstream); the state (open, closing by client / RabbitMQ / proxy)
// changes under ch.mu and is read atomically on the hot path; ch.mu also
// guards the confirm map, tx mode and the queue of pending replies.
//
// # Confirm tag mapping
//
// In confirm mode the proxy may answer publishes itself, so each channel
// keeps the client's sequence and RabbitMQ's apart (confirms): every client
// publish gets the next client tag; a relayed one also the next upstream
// tag. RabbitMQ's acks and nacks (single or multiple, in any order) are
// translated by the client writer, in stream order, into client tags: one
// multiple=true frame for the gapless run from the lowest pending client
// tag, single frames for the rest, so multiple=true never spans a tag that
// is pending or was confirmed earlier on its own (amqp091-go would turn such
// an earlier nack into an ack). basic.return is relayed before the ack that
// follows it upstream. Answers for a channel already closed on the client
// hop are dropped (amqp091-go closes the whole connection on a basic.ack for
// a closed channel).
//
// # Seams for the delayed-exchange layer
//
// Config.Interceptor.Open returns ConnHooks for a connection (nil: pure
// relay). What the next layer needs and where it is:
//
//   - Take over a publish: InterceptsPublish chooses (by exchange) at
//     basic.publish and returns a claim, what it looked up to decide; a
//     publish it passes by is offered to InterceptsContent once its content
//     header is in, when the header carries a headers table (the proxy
//     holds the method frame meanwhile, and takes its confirm tags after,
//     so the message's frames go upstream together and tags stay in
//     order). The proxy assembles method, header and body into a Publish
//     (claim in Publish.Claim) and calls ConnHooks.Publish in the client reader
//     (blocking there is back-pressure on that client). The hook either
//     calls p.Relay() before returning (x-delay <= 0: the message goes
//     upstream in order), or keeps p and later, from any goroutine, calls
//     p.Ack(), p.Nack() (client tags are handled by the proxy; no-ops
//     outside confirm mode) or p.CloseChannel(406, ...).
//   - Rewrite a method or act on RabbitMQ's answer: list the method in
//     Methods(); Method(call) runs in order with the client's frames and
//     calls call.Relay(rewritten or nil, onReply), call.Answer(m) or
//     call.CloseChannel(code, text). onReply gets RabbitMQ's answer (or
//     Reply.Err when the channel closed first) and calls r.Pass(),
//     r.Send(m), r.Drop() or r.CloseChannel(...), at once or later; answers
//     reach the client in the order of its requests whatever the hooks do.
//     A no-wait request can be relayed as synchronous and its answer
//     dropped, so the layer learns the outcome. basic.get-ok is always
//     passed at once (its content follows it).
//   - Close a channel: Channel.CloseChannel(code, text) from any goroutine
//     closes the channel upstream first, then tells the client with code
//     and text and waits for its close-ok; pending confirms and replies of
//     the channel are never sent. A channel.close of the client's that
//     crosses it is answered after it with close-ok, as RabbitMQ answers
//     one after its own channel error; and a client's channel.close waits
//     while publishes taken over on the channel are unanswered, so that a
//     refusal reaches a client that publishes and closes in one write.
//     Conn.Close(code, text) closes the connection the same way.
//   - tx: Channel.TxMode tells a publish hook to keep taken-over messages
//     with the transaction; hooks on tx.commit (Relay with onReply: store,
//     then r.Pass() or r.CloseChannel(506, ...)) and tx.rollback (drop)
//     gate them. The test TestInterceptTxGating shows the pattern.
//   - Authorization: Conn.CheckPublish asks RabbitMQ, over a probe
//     connection of the session's own (dialled on the first check, logged
//     in as the client, closed with the session), whether the user may
//     publish to an exchange and routing key: a publish with an empty body
//     in a transaction rolled back (authz.go, probeconn.go).
//   - Conn carries the vhost, user, client properties and tuning;
//     ConnHooks.Closed is called once after every other hook returned.
//
// Design notes, the file map and figures: docs/amqpproxy.md.
package amqpproxy
