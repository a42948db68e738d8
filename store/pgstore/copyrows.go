package pgstore

import (
	"bytes"
	"encoding/binary"

	"github.com/delayproxy/delayproxy/store"
)

// copyMessagesSQL stores the rows of a copyRows: one COPY for a whole
// group commit, the cheapest insert PostgreSQL has (no parse of a
// statement's arrays, no executor per row).
const copyMessagesSQL = `COPY S.messages (part, k, incarnation, vhost, exchange, routing_key, mandatory,
	properties, body, delay, priority, message_id) FROM STDIN (FORMAT binary)`

// copyRows is messages in PostgreSQL's binary COPY format, the columns of
// copyMessagesSQL in order:
//
//	header  "PGCOPY\n\377\r\n\0" | flags int32 0 | extension length int32 0
//	row     field count int16 (12) | per field: length int32 | its bytes
//	          part int2 | k bytea 17 | incarnation int8 | vhost text | exchange text |
//	          routing_key text | mandatory bool 1 | properties bytea |
//	          body bytea | delay int8 | priority int2 | message_id text
//	trailer int16 -1
//
// Integers are big-endian; text is the string's bytes; no field is NULL.
type copyRows struct {
	buf []byte
}

// copySignature opens every binary COPY stream.
const copySignature = "PGCOPY\n\377\r\n\x00"

// copyFields is the field count of a row.
const copyFields = 12

// newCopyRows starts a stream with room for about size bytes of messages.
func newCopyRows(size int) *copyRows {
	c := &copyRows{buf: make([]byte, 0, len(copySignature)+8+size+2)}
	c.buf = append(c.buf, copySignature...)
	c.buf = binary.BigEndian.AppendUint32(c.buf, 0) // flags
	c.buf = binary.BigEndian.AppendUint32(c.buf, 0) // header extension length
	return c
}

// copyRowSize is about the bytes m takes in the stream.
func copyRowSize(m *store.Message) int {
	return 2 + copyFields*4 + 2 + store.KeySize + 8 + len(m.VHost) + len(m.Exchange) + len(m.RoutingKey) + 1 +
		len(m.Properties) + len(m.Body) + 8 + 2 + len(m.MessageID)
}

// add appends m, whose Key is set.
func (c *copyRows) add(m *store.Message) {
	c.buf = binary.BigEndian.AppendUint16(c.buf, copyFields)
	c.int2(partOf(m.Key))
	c.bytes(m.Key[:])
	c.int8(int64(m.Incarnation))
	c.text(m.VHost)
	c.text(m.Exchange)
	c.text(m.RoutingKey)
	mandatory := byte(0)
	if m.Mandatory {
		mandatory = 1
	}
	c.bytes([]byte{mandatory})
	c.bytes(m.Properties)
	c.bytes(m.Body)
	c.int8(m.Delay)
	c.int2(int16(m.Priority))
	c.text(m.MessageID)
}

func (c *copyRows) bytes(b []byte) {
	c.buf = binary.BigEndian.AppendUint32(c.buf, uint32(len(b)))
	c.buf = append(c.buf, b...)
}

func (c *copyRows) text(s string) {
	c.buf = binary.BigEndian.AppendUint32(c.buf, uint32(len(s)))
	c.buf = append(c.buf, s...)
}

func (c *copyRows) int2(v int16) {
	c.buf = binary.BigEndian.AppendUint32(c.buf, 2)
	c.buf = binary.BigEndian.AppendUint16(c.buf, uint16(v))
}

func (c *copyRows) int8(v int64) {
	c.buf = binary.BigEndian.AppendUint32(c.buf, 8)
	c.buf = binary.BigEndian.AppendUint64(c.buf, uint64(v))
}

// reader ends the stream and reads it.
func (c *copyRows) reader() *bytes.Reader {
	c.buf = binary.BigEndian.AppendUint16(c.buf, 0xffff) // trailer: -1
	return bytes.NewReader(c.buf)
}
