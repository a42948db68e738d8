package store

import "encoding/binary"

// KeySize is the length of a Key in bytes.
const KeySize = 17

// Key identifies a stored message and orders release:
//
//	 0               8      9              17
//	+---------------+------+---------------+
//	| due ms (BE)   | 255- | sequence (BE) |
//	| unix millis   | prio |               |
//	+---------------+------+---------------+
//
// Byte order is release order: earlier due first, then higher priority, then
// publish order.
type Key [KeySize]byte

// MakeKey builds the key of a message due at due (unix ms) with the given
// priority and sequence.
func MakeKey(due int64, priority uint8, seq uint64) Key {
	var k Key
	binary.BigEndian.PutUint64(k[0:8], uint64(due))
	k[8] = 255 - priority
	binary.BigEndian.PutUint64(k[9:17], seq)
	return k
}

// Due is the due time in unix milliseconds.
func (k Key) Due() int64 { return int64(binary.BigEndian.Uint64(k[0:8])) }

// Priority is the AMQP priority (0-255).
func (k Key) Priority() uint8 { return 255 - k[8] }

// Seq is the store-wide publish sequence.
func (k Key) Seq() uint64 { return binary.BigEndian.Uint64(k[9:17]) }

// CompareKeys orders keys in release order, as bytes.Compare orders their
// bytes (in three word compares): it sorts and searches slices of keys.
func CompareKeys(a, b Key) int {
	if x, y := binary.BigEndian.Uint64(a[0:8]), binary.BigEndian.Uint64(b[0:8]); x != y {
		if x < y {
			return -1
		}
		return 1
	}
	if a[8] != b[8] {
		if a[8] < b[8] {
			return -1
		}
		return 1
	}
	x, y := binary.BigEndian.Uint64(a[9:17]), binary.BigEndian.Uint64(b[9:17])
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}
