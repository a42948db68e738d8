// Package wire is delayproxy's AMQP 0-9-1 codec: frames, the protocol
// header, every method of the spec (generated from the spec XML, with
// RabbitMQ's extensions), field tables, content headers and the basic
// class's properties. It holds no connection state; the relay in package
// amqpproxy decides what to do with what it decodes.
//
// # Invariants
//
//   - Decoders never panic, whatever the input (fuzzed: go test -fuzz).
//   - Every length read from the wire is checked against what remains before
//     anything is sliced or allocated; a frame header that declares 4 GiB
//     costs memory only for the bytes that actually arrive.
//   - Tables that are not interpreted stay raw bytes (Table) and pass
//     byte-exact (invariant 7 of package delayproxy): AppendWithHeader
//     copies every entry and property it does not touch unchanged.
//   - Decoded Tables and []byte fields alias the buffer they came from
//     (a Reader reuses its buffer at the next ReadFrame); strings are copies.
//   - Errors of the protocol are *Error carrying the reply code RabbitMQ 3.10
//     uses: 501 FRAME_ERROR for anything that cannot be decoded (RabbitMQ's
//     "cannot decode"), including trailing bytes after a method's last
//     field; 503 COMMAND_INVALID for an unknown class or method (RabbitMQ
//     drops the TCP connection there without a close); 505 UNEXPECTED_FRAME
//     for a heartbeat on a channel other than 0. errors.Is finds the
//     sentinel (ErrShort, ErrTrailing, ...) inside.
//   - Encoders never fail and never panic: Method.Append cuts a shortstr
//     over 255 bytes on a UTF-8 boundary and a longstr at 4 GiB.
//   - The hot path does not allocate: PeekMethodID reads a method id, and
//     DecodeContentHeader leaves the property list raw, as RabbitMQ does
//     until it needs it. DecodeMethod allocates the method struct; a caller
//     that cares decodes into its own (var p BasicPublish;
//     p.Decode(payload[4:])).
//
// # Wire layouts
//
// Frame (spec 4.2.3):
//
//	0      1         3             7                  7+size
//	+------+---------+-------------+------------------+------+
//	| type | channel | size (BE32) | payload          | 0xCE |
//	+------+---------+-------------+------------------+------+
//	type: 1 method, 2 content header, 3 body, 8 heartbeat
//
// Method frame payload:
//
//	0          2           4
//	+----------+-----------+---------------------------------------+
//	| class-id | method-id | arguments, in spec order               |
//	+----------+-----------+---------------------------------------+
//	octet 1 B, short 2 B, long 4 B, longlong and timestamp 8 B (all big
//	endian); shortstr: length (1 B) + bytes; longstr and table: length
//	(4 B) + bytes; consecutive bits packed into one octet, first bit in
//	the least significant position.
//
// Content header payload:
//
//	0          2        4                12               14
//	+----------+--------+-----------------+----------------+---------------+
//	| class-id | weight | body-size (u64) | property-flags | property-list |
//	+----------+--------+-----------------+----------------+---------------+
//	flags: bit 15 content-type ... bit 2 cluster-id, bit 1 unused, bit 0
//	continuation (another flags word follows); the list holds the present
//	properties in flag order.
//
// Field table: length (4 B, not part of Table) then entries:
//
//	+-------------+------------+------+-------------------------------+
//	| name length | name       | type | value (size set by the type)  |
//	| 1 B         | 0..255 B   | 1 B  | fixed, or length (4 B) + data |
//	+-------------+------------+------+-------------------------------+
//	S x F A: 4-byte length then data; an array (A) is (type, value)* with
//	no names. Type codes are RabbitMQ's; see Table.
package wire
