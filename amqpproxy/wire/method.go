package wire

import (
	"encoding/binary"
	"math"
	"strconv"
	"unicode/utf8"
)

//go:generate go run ./internal/gen

// MethodID identifies a method: class<<16 | method.
type MethodID uint32

// Class is the method's class id (60 for basic).
func (id MethodID) Class() uint16 { return uint16(id >> 16) }

// Method is the method's index within its class (40 for basic.publish).
func (id MethodID) Method() uint16 { return uint16(id) }

// Method is one decoded AMQP method. Every method of the spec has a struct
// in methods_gen.go whose pointer implements Method.
//
// Field types: bit bool, octet uint8, short uint16, long uint32, longlong
// and timestamp uint64, shortstr string, longstr []byte, table Table.
// Decoded []byte and Table fields alias the payload they were decoded from;
// strings are copies.
type Method interface {
	// ID is the method's class and index.
	ID() MethodID
	// Decode reads the method's arguments (the payload after the 4-byte
	// method id). It never panics; it fails with an *Error (501
	// FRAME_ERROR) when args are truncated, carry trailing bytes, or hold a
	// malformed table, as RabbitMQ does.
	Decode(args []byte) error
	// Append appends the method's arguments to dst. It never fails: a
	// shortstr longer than 255 bytes is cut at 255 (on a UTF-8 boundary).
	Append(dst []byte) []byte
}

// PeekMethodID returns the method id at the start of a method frame payload.
func PeekMethodID(payload []byte) (MethodID, error) {
	if len(payload) < 4 {
		return 0, &Error{Code: FrameError, Text: "method frame shorter than its method id", cause: ErrShort}
	}
	return MethodID(binary.BigEndian.Uint32(payload)), nil
}

// DecodeMethod decodes a whole method frame payload. An unknown class or
// method gives an *Error with 503 COMMAND_INVALID (RabbitMQ 3.10 drops the
// connection without a close; 503 is what it answers to methods it does not
// handle); truncated arguments, trailing bytes and malformed tables give 501
// FRAME_ERROR, as RabbitMQ's "cannot decode". Every table argument is
// validated.
//
// DecodeMethod allocates the method struct; on hot paths switch on
// PeekMethodID and Decode into a struct of your own.
func DecodeMethod(payload []byte) (Method, error) {
	id, err := PeekMethodID(payload)
	if err != nil {
		return nil, err
	}
	m := newMethod(id)
	if m == nil {
		return nil, &Error{Code: CommandInvalid, Text: "unknown method " + itoa(uint64(id.Class())) + "." + itoa(uint64(id.Method())),
			ClassID: id.Class(), MethodID: id.Method(), cause: ErrUnknownMethod}
	}
	if err := m.Decode(payload[4:]); err != nil {
		return nil, err
	}
	return m, nil
}

// AppendMethod appends a whole method frame payload (class id, method id,
// arguments) to dst. Like Method.Append it never fails.
func AppendMethod(dst []byte, m Method) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(m.ID()))
	return m.Append(dst)
}

// decoder reads fields in order with a sticky error: after the first short
// read every accessor returns zero values and finish reports the failure.
type decoder struct {
	b     []byte
	off   int
	trunc bool  // a field ran past the end
	err   error // a table failed validation
}

func (d *decoder) take(n int) []byte {
	if d.trunc || n > len(d.b)-d.off {
		d.trunc = true
		return nil
	}
	p := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

func (d *decoder) octet() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) short() uint16 {
	if p := d.take(2); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) long() uint32 {
	if p := d.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) longlong() uint64 {
	if p := d.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) shortstr() string {
	n := int(d.octet())
	if n == 0 {
		return ""
	}
	return string(d.take(n))
}

// longstr returns the bytes, aliasing the input; nil for an empty string.
func (d *decoder) longstr() []byte {
	n := d.long()
	if d.trunc || uint64(n) > uint64(len(d.b)-d.off) {
		d.trunc = true
		return nil
	}
	if n == 0 {
		return nil
	}
	return d.take(int(n))
}

// table returns the table's entries, aliasing the input, after validating
// them; nil for an empty table.
func (d *decoder) table() Table {
	t := Table(d.longstr())
	if d.trunc || d.err != nil || len(t) == 0 {
		return nil
	}
	if err := t.Validate(); err != nil {
		d.err = err
		return nil
	}
	return t
}

// finish reports a short read, a bad table, or trailing bytes.
func (d *decoder) finish(id MethodID) error {
	if d.err != nil {
		return methodError(id, d.err)
	}
	if d.trunc {
		return methodError(id, ErrShort)
	}
	return finish(d.b, d.off, id)
}

func finish(b []byte, off int, id MethodID) error {
	if off != len(b) {
		return methodError(id, ErrTrailing)
	}
	return nil
}

// methodError wraps a decoding failure of a method's arguments the way
// RabbitMQ reports it: 501 FRAME_ERROR naming the method.
func methodError(id MethodID, cause error) *Error {
	text := cause.Error()
	var code uint16 = FrameError
	if e, ok := cause.(*Error); ok {
		text, code = e.Text, e.Code
	}
	return &Error{Code: code, Text: "cannot decode " + id.String() + ": " + text,
		ClassID: id.Class(), MethodID: id.Method(), cause: cause}
}

func appendShort(dst []byte, v uint16) []byte    { return binary.BigEndian.AppendUint16(dst, v) }
func appendLong(dst []byte, v uint32) []byte     { return binary.BigEndian.AppendUint32(dst, v) }
func appendLonglong(dst []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(dst, v) }

// appendShortstr appends s, cut to 255 bytes on a UTF-8 boundary.
func appendShortstr(dst []byte, s string) []byte {
	s = truncShortstr(s)
	dst = append(dst, byte(len(s)))
	return append(dst, s...)
}

func truncShortstr(s string) string {
	if len(s) <= math.MaxUint8 {
		return s
	}
	n := math.MaxUint8
	for n > math.MaxUint8-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// appendLongstr appends b, cut to 2^32-1 bytes.
func appendLongstr(dst []byte, b []byte) []byte {
	if uint64(len(b)) > math.MaxUint32 {
		b = b[:math.MaxUint32]
	}
	dst = appendLong(dst, uint32(len(b)))
	return append(dst, b...)
}

// appendTable appends the table's length and its raw entries.
func appendTable(dst []byte, t Table) []byte { return appendLongstr(dst, t) }

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
