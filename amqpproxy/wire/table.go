package wire

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"time"
)

// MaxTableDepth bounds how deep tables and arrays may nest inside a table
// (the outermost table is depth 0). RabbitMQ sets no limit; real clients
// nest one or two levels.
const MaxTableDepth = 64

// Table is an AMQP field table: its entries exactly as on the wire, without
// the 4-byte length prefix that precedes them in a method or a property
// list. nil is the empty table. A decoded Table aliases the payload it came
// from; AppendWithHeader leaves every entry it does not touch byte-exact.
//
// Field types follow RabbitMQ (rabbit_binary_parser and the 0-9-1 errata),
// with the Go type Get decodes each to:
//
//	t bool      b int8     B uint8    s int16 (not shortstr)   u uint16
//	I int32     i uint32   l int64    f float32   d float64
//	D Decimal   S string   x []byte   A []any     T time.Time (UTC, seconds)
//	F Table     V nil
//
// On encode, int is written as l, and map[string]any as F (sorted keys).
type Table []byte

// Decimal is a field-table decimal: Value / 10^Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// entry is one table entry: name, type code and value, each a sub-slice of
// the table; end is the offset just past the value.
type entry struct {
	name []byte
	typ  byte
	val  []byte
	end  int
}

// next parses the entry at off. deep validates nested tables and arrays.
func (t Table) next(off int, deep bool) (entry, error) {
	b := t[off:]
	if len(b) < 1 || len(b) < 1+int(b[0])+1 {
		return entry{}, ErrShort
	}
	n := int(b[0])
	e := entry{name: b[1 : 1+n], typ: b[1+n]}
	size, err := valueSize(e.typ, b[2+n:], 0, deep)
	if err != nil {
		return entry{}, entryError(e.name, err)
	}
	e.val = b[2+n : 2+n+size]
	e.end = off + 2 + n + size
	return e, nil
}

// valueSize is the encoded size of a value of type typ at the start of b.
// With deep set it validates nested tables and arrays, which sit at depth
// depth+1.
func valueSize(typ byte, b []byte, depth int, deep bool) (int, error) {
	var n int
	switch typ {
	case 'V':
		return 0, nil
	case 't', 'b', 'B':
		n = 1
	case 's', 'u':
		n = 2
	case 'I', 'i', 'f':
		n = 4
	case 'D':
		n = 5
	case 'l', 'd', 'T':
		n = 8
	case 'S', 'x', 'F', 'A':
		if len(b) < 4 {
			return 0, ErrShort
		}
		size := binary.BigEndian.Uint32(b)
		if uint64(size) > uint64(len(b)-4) {
			return 0, ErrShort
		}
		n = 4 + int(size)
		if deep && (typ == 'F' || typ == 'A') {
			if depth >= MaxTableDepth {
				return 0, ErrTooDeep
			}
			var err error
			if typ == 'F' {
				err = validateTable(b[4:n], depth+1)
			} else {
				err = validateArray(b[4:n], depth+1)
			}
			if err != nil {
				return 0, err
			}
		}
	default:
		return 0, ErrFieldType
	}
	if n > len(b) {
		return 0, ErrShort
	}
	return n, nil
}

func validateTable(b []byte, depth int) error {
	for off := 0; off < len(b); {
		r := b[off:]
		if len(r) < 2+int(r[0]) {
			return ErrShort
		}
		n := int(r[0])
		size, err := valueSize(r[1+n], r[2+n:], depth, true)
		if err != nil {
			return entryError(r[1:1+n], err)
		}
		off += 2 + n + size
	}
	return nil
}

func validateArray(b []byte, depth int) error {
	for off := 0; off < len(b); {
		size, err := valueSize(b[off], b[off+1:], depth, true)
		if err != nil {
			return err
		}
		off += 1 + size
	}
	return nil
}

// entryError names the table entry a nested failure is in.
func entryError(name []byte, err error) error {
	e, ok := err.(*Error)
	if !ok {
		return err
	}
	var cause error = e
	if e.cause != nil {
		cause = e.cause
	}
	return &Error{Code: e.Code, Text: "table entry " + strconv.Quote(string(name)) + ": " + e.Text, cause: cause}
}

// Validate checks the whole table: every entry's type code and length, and
// nested tables and arrays down to MaxTableDepth. Errors are *Error with
// 501 FRAME_ERROR.
func (t Table) Validate() error { return validateTable(t, 0) }

// Get returns the value of the first entry named name, decoded as the Table
// doc says, skipping the other entries without decoding them. A nested
// table is returned raw and unvalidated; an array is decoded and validated.
func (t Table) Get(name string) (any, bool, error) {
	for off := 0; off < len(t); {
		e, err := t.next(off, false)
		if err != nil {
			return nil, false, err
		}
		if string(e.name) == name {
			v, err := decodeValue(e.typ, e.val, 0)
			if err != nil {
				return nil, false, entryError(e.name, err)
			}
			return v, true, nil
		}
		off = e.end
	}
	return nil, false, nil
}

// Find calls fn(i, value) for the first entry named names[i], for each
// name present, in one pass over t that parses entry lengths only and
// decodes only those values (as Get does). It stops at the first entry
// that cannot be parsed and returns its error, having called fn for the
// names found before it.
func (t Table) Find(names []string, fn func(i int, v any)) error {
	var seen uint64 // bit i: names[i] found; names past 64 are never looked for
	for off := 0; off < len(t); {
		e, err := t.next(off, false)
		if err != nil {
			return err
		}
		for i, name := range names {
			if i < 64 && seen&(1<<i) == 0 && string(e.name) == name {
				seen |= 1 << i
				v, err := decodeValue(e.typ, e.val, 0)
				if err != nil {
					return entryError(e.name, err)
				}
				fn(i, v)
				break
			}
		}
		off = e.end
	}
	return nil
}

// decodeValue decodes one value whose extent valueSize already checked.
func decodeValue(typ byte, v []byte, depth int) (any, error) {
	switch typ {
	case 'V':
		return nil, nil
	case 't':
		return v[0] != 0, nil
	case 'b':
		return int8(v[0]), nil
	case 'B':
		return v[0], nil
	case 's':
		return int16(binary.BigEndian.Uint16(v)), nil
	case 'u':
		return binary.BigEndian.Uint16(v), nil
	case 'I':
		return int32(binary.BigEndian.Uint32(v)), nil
	case 'i':
		return binary.BigEndian.Uint32(v), nil
	case 'l':
		return int64(binary.BigEndian.Uint64(v)), nil
	case 'f':
		return math.Float32frombits(binary.BigEndian.Uint32(v)), nil
	case 'd':
		return math.Float64frombits(binary.BigEndian.Uint64(v)), nil
	case 'D':
		return Decimal{Scale: v[0], Value: int32(binary.BigEndian.Uint32(v[1:]))}, nil
	case 'T':
		return time.Unix(int64(binary.BigEndian.Uint64(v)), 0).UTC(), nil
	case 'S':
		return string(v[4:]), nil
	case 'x':
		return []byte(v[4:len(v):len(v)]), nil
	case 'F':
		return Table(v[4:len(v):len(v)]), nil
	case 'A':
		return decodeArray(v[4:], depth+1)
	}
	return nil, ErrFieldType
}

func decodeArray(b []byte, depth int) ([]any, error) {
	if depth > MaxTableDepth {
		return nil, ErrTooDeep
	}
	var out []any
	for off := 0; off < len(b); {
		typ := b[off]
		size, err := valueSize(typ, b[off+1:], depth, true)
		if err != nil {
			return nil, err
		}
		v, err := decodeValue(typ, b[off+1:off+1+size], depth)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		off += 1 + size
	}
	if out == nil {
		out = []any{}
	}
	return out, nil
}

// find locates the first entry named name: its value, type code included,
// is t[at:at+n]. again reports another entry of that name after it. It
// parses entries' lengths only, failing as Validate does on one that cannot
// be parsed.
func (t Table) find(name string) (at, n int, found, again bool, err error) {
	for off := 0; off < len(t); {
		e, err := t.next(off, false)
		if err != nil {
			return 0, 0, false, false, err
		}
		if string(e.name) == name {
			if found {
				return at, n, true, true, nil
			}
			at, n, found = off+1+len(e.name), e.end-off-1-len(e.name), true
		}
		off = e.end
	}
	return at, n, found, false, nil
}

// With returns a copy of t with name = field (a type code and its value):
// the first entry of that name takes field in its place, later ones are
// dropped, and without one the entry goes last. Every other entry is copied
// byte-exact. It fails on a malformed t, field or name.
func (t Table) With(name string, field []byte) (Table, error) {
	if len(name) > math.MaxUint8 {
		return nil, &Error{Code: SyntaxError, Text: "table entry name of " + strconv.Itoa(len(name)) + " bytes", cause: ErrTooLong}
	}
	if err := checkField(field); err != nil {
		return nil, err
	}
	if _, _, _, _, err := t.find(name); err != nil {
		return nil, err
	}
	return t.appendWith(make(Table, 0, len(t)+1+len(name)+len(field)), name, field), nil
}

// appendWith appends t's entries to dst with name = field (a type code and
// its value): the first entry of that name takes field in its place, later
// ones are dropped, and without one the entry goes last. Every other entry
// is copied byte-exact. t must parse (find checked it).
func (t Table) appendWith(dst []byte, name string, field []byte) []byte {
	done := false
	for off := 0; off < len(t); {
		e, _ := t.next(off, false)
		if string(e.name) != name {
			dst = append(dst, t[off:e.end]...)
		} else if !done {
			dst = appendRawEntry(dst, name, field)
			done = true
		}
		off = e.end
	}
	if !done {
		dst = appendRawEntry(dst, name, field)
	}
	return dst
}

// appendRawEntry appends an entry whose value is already encoded; name is
// at most 255 bytes.
func appendRawEntry(dst []byte, name string, field []byte) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	return append(dst, field...)
}

// checkField reports whether field is exactly one well-formed value: a type
// code and the value it sizes, nested tables and arrays valid.
func checkField(field []byte) error {
	if len(field) == 0 {
		return &Error{Code: SyntaxError, Text: "empty field value", cause: ErrBadValue}
	}
	n, err := valueSize(field[0], field[1:], 0, true)
	if err != nil {
		text := err.Error()
		if e, ok := err.(*Error); ok {
			text = e.Text
		}
		return &Error{Code: SyntaxError, Text: "field value: " + text, cause: ErrBadValue}
	}
	if n != len(field)-1 {
		return &Error{Code: SyntaxError, Text: "field value: " + strconv.Itoa(len(field)-1-n) + " bytes after it", cause: ErrBadValue}
	}
	return nil
}

// EncodeTable encodes m with its keys in sorted order, so equal maps give
// equal bytes.
func EncodeTable(m map[string]any) (Table, error) { return encodeTable(nil, m, 0) }

func encodeTable(dst []byte, m map[string]any, depth int) ([]byte, error) {
	if depth > MaxTableDepth {
		return nil, ErrTooDeep
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var err error
		if dst, err = appendEntryDepth(dst, k, m[k], depth); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func appendEntryDepth(dst []byte, name string, v any, depth int) ([]byte, error) {
	if len(name) > math.MaxUint8 {
		return nil, &Error{Code: SyntaxError, Text: "table entry name of " + strconv.Itoa(len(name)) + " bytes", cause: ErrTooLong}
	}
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	out, err := appendValue(dst, v, depth)
	if err != nil {
		return nil, entryError([]byte(name), err)
	}
	return out, nil
}

// appendValue appends a type code and a value.
func appendValue(dst []byte, v any, depth int) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, 'V'), nil
	case bool:
		b := byte(0)
		if v {
			b = 1
		}
		return append(dst, 't', b), nil
	case int8:
		return append(dst, 'b', byte(v)), nil
	case uint8:
		return append(dst, 'B', v), nil
	case int16:
		return binary.BigEndian.AppendUint16(append(dst, 's'), uint16(v)), nil
	case uint16:
		return binary.BigEndian.AppendUint16(append(dst, 'u'), v), nil
	case int32:
		return binary.BigEndian.AppendUint32(append(dst, 'I'), uint32(v)), nil
	case uint32:
		return binary.BigEndian.AppendUint32(append(dst, 'i'), v), nil
	case int64:
		return binary.BigEndian.AppendUint64(append(dst, 'l'), uint64(v)), nil
	case int:
		return binary.BigEndian.AppendUint64(append(dst, 'l'), uint64(int64(v))), nil
	case float32:
		return binary.BigEndian.AppendUint32(append(dst, 'f'), math.Float32bits(v)), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(dst, 'd'), math.Float64bits(v)), nil
	case Decimal:
		return binary.BigEndian.AppendUint32(append(dst, 'D', v.Scale), uint32(v.Value)), nil
	case time.Time:
		return binary.BigEndian.AppendUint64(append(dst, 'T'), uint64(v.Unix())), nil
	case string:
		if uint64(len(v)) > math.MaxUint32 {
			return nil, ErrTooLong
		}
		return append(binary.BigEndian.AppendUint32(append(dst, 'S'), uint32(len(v))), v...), nil
	case []byte:
		if uint64(len(v)) > math.MaxUint32 {
			return nil, ErrTooLong
		}
		return append(binary.BigEndian.AppendUint32(append(dst, 'x'), uint32(len(v))), v...), nil
	case Table:
		if uint64(len(v)) > math.MaxUint32 {
			return nil, ErrTooLong
		}
		if depth >= MaxTableDepth {
			return nil, ErrTooDeep
		}
		if err := validateTable(v, depth+1); err != nil {
			return nil, err
		}
		return append(binary.BigEndian.AppendUint32(append(dst, 'F'), uint32(len(v))), v...), nil
	case map[string]any:
		return appendNested(dst, 'F', depth, func(dst []byte) ([]byte, error) { return encodeTable(dst, v, depth+1) })
	case []any:
		return appendNested(dst, 'A', depth, func(dst []byte) ([]byte, error) {
			for _, x := range v {
				var err error
				if dst, err = appendValue(dst, x, depth+1); err != nil {
					return nil, err
				}
			}
			return dst, nil
		})
	}
	return nil, ErrBadValue
}

// appendNested appends typ, a length placeholder, the body fill writes, and
// then patches the length.
func appendNested(dst []byte, typ byte, depth int, fill func([]byte) ([]byte, error)) ([]byte, error) {
	if depth >= MaxTableDepth {
		return nil, ErrTooDeep
	}
	dst = append(dst, typ, 0, 0, 0, 0)
	start := len(dst)
	dst, err := fill(dst)
	if err != nil {
		return nil, err
	}
	n := len(dst) - start
	if uint64(n) > math.MaxUint32 {
		return nil, ErrTooLong
	}
	binary.BigEndian.PutUint32(dst[start-4:start], uint32(n))
	return dst, nil
}
