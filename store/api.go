package store

import (
	"encoding/binary"
	"errors"
	"time"
)

// Sentinel errors returned by the store. Callers match them with errors.Is.
var (
	// ErrClosed: the store has been closed; nothing was written.
	ErrClosed = errors.New("store: closed")
	// ErrNotStore: the file exists but is not a delayproxy store.
	ErrNotStore = errors.New("store: not a delayproxy store")
	// ErrSchemaTooNew: the file was written by a newer delayproxy.
	ErrSchemaTooNew = errors.New("store: schema version is newer than this delayproxy")
	// ErrUnknownExchange: Put named an exchange that is not in the registry.
	ErrUnknownExchange = errors.New("store: exchange is not a registered delayed exchange")
)

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

// Message is one delayed message as stored.
type Message struct {
	Key         Key    // assigned by Put from Due, Priority and a new sequence
	VHost       string // virtual host of the delayed exchange
	Exchange    string // name of the delayed exchange
	RoutingKey  string
	Mandatory   bool
	Properties  []byte // raw content-header property flags and list, byte-exact
	Body        []byte
	Due         int64  // unix milliseconds at which to release
	Delay       int64  // the x-delay asked for, ms (the release sets x-delay = -Delay)
	Priority    uint8  // AMQP priority property, 0 when absent
	MessageID   string // AMQP message-id property, "" when absent
	Incarnation uint64 // registry incarnation of the exchange; set by Put
}

// ExchangeDef is a delayed exchange as recorded in the registry.
type ExchangeDef struct {
	VHost       string
	Name        string
	DelayedType string // x-delayed-type: direct, topic, fanout, headers, ...
	Durable     bool
	AutoDelete  bool
	Internal    bool
	Arguments   []byte // raw AMQP field table as declared (x-delayed-type included)
	Incarnation uint64 // assigned by PutExchange; a re-created exchange gets a new one
}

// ExchangeCount is the number of pending messages of one delayed exchange.
type ExchangeCount struct {
	VHost    string
	Exchange string
	Pending  int64
	NextDue  int64 // unix ms of the earliest pending message, 0 when none
}

// Options tune the bbolt file. The zero value is a good default.
type Options struct {
	SlotWidth       time.Duration // width of a time slot bucket; default 1s
	NoSync          bool          // skip fsync (tests and benchmarks only)
	InitialMmapSize int           // bytes; default 1 GiB
	MaxBatch        int           // most messages in one group commit; default 10000
}
