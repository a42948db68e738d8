package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/delayproxy/delayproxy/store"
)

// A message's due time and priority live in its key. The value (version 1):
//
//	 0     1       2                  10
//	+-----+-------+------------------+-----------+
//	| ver | flags | incarnation BE   | delay     |  flags: 1 mandatory,
//	| =1  |       | (8 B)            | (varint)  |         2 has message-id
//	+-----+-------+------------------+-----------+
//	| uvarint len + vhost            |
//	| uvarint len + exchange         |
//	| uvarint len + routing key      |
//	| uvarint len + message-id       |
//	| uvarint len + properties       |  raw content-header property flags
//	|                                |  and list, byte-exact
//	| body (rest of the value)       |
//	+--------------------------------+
//
// An exchange definition: ver (1 or 2), flags (1: durable, 2: auto-delete,
// 4: internal, 8: delivery-time kind), incarnation (8 B BE), uvarint len +
// x-delayed-type, then the raw argument table as the rest of the value.
// A KindDelayed entry is written as version 1, byte for byte as before
// store.ExchangeKind existed; a KindDeliveryTime entry as version 2, with
// flag 8, so that an older delayproxy refuses the file instead of taking
// the entry for a delayed exchange. Both versions are read.

// Encoding versions. A decoder refuses versions it does not know.
const (
	msgVersion             = 1
	defVersion             = 1
	defVersionDeliveryTime = 2

	msgHeaderSize = 10 // version, flags, incarnation
	flagMandatory = 1 << 0
	flagMessageID = 1 << 1

	defDurable      = 1 << 0
	defAutoDelete   = 1 << 1
	defInternal     = 1 << 2
	defDeliveryTime = 1 << 3
)

// errCorrupt is wrapped by decoders: a stored value does not decode.
var errCorrupt = errors.New("store: corrupt value")

// encodeMessage encodes everything of m except Due and Priority, which live
// in the key. The layout is at the top of this file.
func encodeMessage(m *store.Message) []byte {
	n := msgHeaderSize + binary.MaxVarintLen64 +
		5*binary.MaxVarintLen32 + len(m.VHost) + len(m.Exchange) + len(m.RoutingKey) +
		len(m.MessageID) + len(m.Properties) + len(m.Body)
	b := make([]byte, msgHeaderSize, n)
	b[0] = msgVersion
	if m.Mandatory {
		b[1] |= flagMandatory
	}
	if m.MessageID != "" {
		b[1] |= flagMessageID
	}
	binary.BigEndian.PutUint64(b[2:10], m.Incarnation)
	b = binary.AppendVarint(b, m.Delay)
	b = appendString(b, m.VHost)
	b = appendString(b, m.Exchange)
	b = appendString(b, m.RoutingKey)
	b = appendString(b, m.MessageID)
	b = binary.AppendUvarint(b, uint64(len(m.Properties)))
	b = append(b, m.Properties...)
	return append(b, m.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// msgView is a decoded message whose byte fields alias the stored value.
type msgView struct {
	flags       byte
	incarnation uint64
	delay       int64
	vhost       []byte
	exchange    []byte
	routingKey  []byte
	messageID   []byte
	properties  []byte
	body        []byte
}

// viewMessage parses v without copying.
func viewMessage(v []byte) (msgView, error) {
	var m msgView
	if len(v) < msgHeaderSize {
		return m, fmt.Errorf("%w: message of %d bytes", errCorrupt, len(v))
	}
	if v[0] != msgVersion {
		return m, fmt.Errorf("%w: message encoding version %d", errCorrupt, v[0])
	}
	m.flags = v[1]
	m.incarnation = binary.BigEndian.Uint64(v[2:10])
	r := reader{b: v[msgHeaderSize:]}
	m.delay = r.varint()
	m.vhost = r.bytes()
	m.exchange = r.bytes()
	m.routingKey = r.bytes()
	m.messageID = r.bytes()
	m.properties = r.bytes()
	if r.err != nil {
		return m, r.err
	}
	m.body = r.b
	return m, nil
}

// peekIncarnation reads the incarnation of an encoded message.
func peekIncarnation(v []byte) uint64 {
	if len(v) < msgHeaderSize {
		return 0
	}
	return binary.BigEndian.Uint64(v[2:10])
}

// decodeMessage decodes a stored value into a Message that owns its memory.
func decodeMessage(k store.Key, v []byte, withBody bool) (*store.Message, error) {
	mv, err := viewMessage(v)
	if err != nil {
		return nil, err
	}
	m := &store.Message{
		Key:         k,
		VHost:       string(mv.vhost),
		Exchange:    string(mv.exchange),
		RoutingKey:  string(mv.routingKey),
		Mandatory:   mv.flags&flagMandatory != 0,
		Due:         k.Due(),
		Delay:       mv.delay,
		Priority:    k.Priority(),
		MessageID:   string(mv.messageID),
		Incarnation: mv.incarnation,
	}
	n := len(mv.properties)
	if withBody {
		n += len(mv.body)
	}
	buf := make([]byte, 0, n)
	buf = append(buf, mv.properties...)
	m.Properties = buf[:len(mv.properties):len(mv.properties)]
	if withBody {
		buf = append(buf, mv.body...)
		m.Body = buf[len(mv.properties):]
	}
	return m, nil
}

// reader consumes length-prefixed fields; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	x, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: bad varint", errCorrupt)
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *reader) bytes() []byte {
	if r.err != nil {
		return nil
	}
	l, n := binary.Uvarint(r.b)
	if n <= 0 || l > uint64(len(r.b)-n) {
		r.err = fmt.Errorf("%w: bad length", errCorrupt)
		return nil
	}
	f := r.b[n : n+int(l) : n+int(l)]
	r.b = r.b[n+int(l):]
	return f
}

// encodeExchange encodes a registry entry (the key holds vhost and name).
func encodeExchange(d *store.ExchangeDef) []byte {
	b := make([]byte, 10, 10+binary.MaxVarintLen32+len(d.DelayedType)+len(d.Arguments))
	b[0] = defVersion
	if d.Kind == store.KindDeliveryTime {
		b[0] = defVersionDeliveryTime
		b[1] |= defDeliveryTime
	}
	if d.Durable {
		b[1] |= defDurable
	}
	if d.AutoDelete {
		b[1] |= defAutoDelete
	}
	if d.Internal {
		b[1] |= defInternal
	}
	binary.BigEndian.PutUint64(b[2:10], d.Incarnation)
	b = appendString(b, d.DelayedType)
	return append(b, d.Arguments...)
}

// decodeExchange decodes a registry entry.
func decodeExchange(k, v []byte) (store.ExchangeDef, error) {
	var d store.ExchangeDef
	r := reader{b: k}
	vhost := r.bytes()
	if r.err != nil {
		return d, r.err
	}
	if len(v) < 10 || (v[0] != defVersion && v[0] != defVersionDeliveryTime) ||
		(v[0] == defVersionDeliveryTime) != (v[1]&defDeliveryTime != 0) {
		return d, fmt.Errorf("%w: exchange definition", errCorrupt)
	}
	if v[1]&defDeliveryTime != 0 {
		d.Kind = store.KindDeliveryTime
	}
	d.VHost, d.Name = string(vhost), string(r.b)
	d.Durable = v[1]&defDurable != 0
	d.AutoDelete = v[1]&defAutoDelete != 0
	d.Internal = v[1]&defInternal != 0
	d.Incarnation = binary.BigEndian.Uint64(v[2:10])
	r = reader{b: v[10:]}
	d.DelayedType = string(r.bytes())
	if r.err != nil {
		return d, r.err
	}
	if len(r.b) > 0 {
		d.Arguments = append([]byte(nil), r.b...)
	}
	return d, nil
}

// exchangeKey is the registry key: uvarint len(vhost), vhost, name.
func exchangeKey(vhost, name string) []byte {
	b := make([]byte, 0, binary.MaxVarintLen32+len(vhost)+len(name))
	b = appendString(b, vhost)
	return append(b, name...)
}

// idEpochBits sets the width of an ids-index epoch: 1,024 sequence
// numbers. The index is sorted by epoch first, so a commit's entries land
// in the last few leaves, not one leaf each; a cancel by message-id seeks
// once per epoch that holds an entry.
const idEpochBits = 10

// idEpochSize is the length of the epoch that leads every ids-index key.
const idEpochSize = 8

// idEpoch is the ids-index epoch of a message with key k, 8 B BE.
func idEpoch(k store.Key) uint64 { return k.Seq() >> idEpochBits }

// idPrefix is the ids-index prefix of one message-id of one exchange in
// one epoch.
func idPrefix(epoch uint64, vhost, exchange, id []byte) []byte {
	b := make([]byte, 0, idEpochSize+3*binary.MaxVarintLen32+len(vhost)+len(exchange)+len(id)+store.KeySize)
	b = binary.BigEndian.AppendUint64(b, epoch)
	b = binary.AppendUvarint(b, uint64(len(vhost)))
	b = append(b, vhost...)
	b = binary.AppendUvarint(b, uint64(len(exchange)))
	b = append(b, exchange...)
	b = binary.AppendUvarint(b, uint64(len(id)))
	return append(b, id...)
}

// idKey is the ids-index key of one message.
func idKey(vhost, exchange, id []byte, k store.Key) []byte {
	return append(idPrefix(idEpoch(k), vhost, exchange, id), k[:]...)
}

// storedKey is the key a message is stored under, in a slot or a far
// bucket: the Key reordered so that a bucket is appended to in publish
// order: sequence (8 B BE), due ms (8 B BE), 255-priority (1 B).
func storedKey(k store.Key) []byte {
	b := make([]byte, store.KeySize)
	copy(b[0:8], k[9:17])
	copy(b[8:17], k[0:9])
	return b
}

// keyFromStored is the inverse of storedKey.
func keyFromStored(f []byte) store.Key {
	var k store.Key
	copy(k[0:9], f[8:17])
	copy(k[9:17], f[0:8])
	return k
}

// storedDue is the due time of a stored key without building the Key.
func storedDue(f []byte) int64 { return int64(binary.BigEndian.Uint64(f[8:16])) }

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}
