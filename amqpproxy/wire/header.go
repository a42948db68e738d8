package wire

import (
	"encoding/binary"
	"math"
	"strconv"
)

// ContentHeader is the payload of a content header frame:
//
//	 0          2        4                12
//	+----------+--------+-----------------+----------------+---------------+
//	| class-id | weight | body-size (u64) | property-flags | property-list |
//	+----------+--------+-----------------+----------------+---------------+
//	                                        2 bytes each, more while bit 0
//	                                        (continuation) is set
type ContentHeader struct {
	ClassID  uint16
	Weight   uint16
	BodySize uint64
	// Properties is the raw property flags and list. A decoded header
	// aliases the payload.
	Properties []byte
}

// contentHeaderFixed is class-id, weight and body-size.
const contentHeaderFixed = 12

// DecodeContentHeader decodes a header frame payload. Like RabbitMQ it does
// not parse the property list (DecodeProperties does); it checks that the
// fixed fields and the property flag words are there, and fails with a 501
// FRAME_ERROR *Error otherwise. It does not allocate.
func DecodeContentHeader(payload []byte) (ContentHeader, error) {
	if len(payload) < contentHeaderFixed+2 {
		return ContentHeader{}, &Error{Code: FrameError, Text: "content header of " + strconv.Itoa(len(payload)) + " bytes", cause: ErrShort}
	}
	h := ContentHeader{
		ClassID:    binary.BigEndian.Uint16(payload),
		Weight:     binary.BigEndian.Uint16(payload[2:]),
		BodySize:   binary.BigEndian.Uint64(payload[4:]),
		Properties: payload[contentHeaderFixed:len(payload):len(payload)],
	}
	for off := 0; ; off += 2 {
		if len(h.Properties) < off+2 {
			return ContentHeader{}, &Error{Code: FrameError, Text: "content header: property flags continue past the end", cause: ErrShort}
		}
		if h.Properties[off+1]&1 == 0 {
			break
		}
	}
	return h, nil
}

// AppendContentHeader appends a header frame payload to dst. Empty
// Properties are written as a zero flags word (no properties).
func AppendContentHeader(dst []byte, h ContentHeader) []byte {
	dst = binary.BigEndian.AppendUint16(dst, h.ClassID)
	dst = binary.BigEndian.AppendUint16(dst, h.Weight)
	dst = binary.BigEndian.AppendUint64(dst, h.BodySize)
	if len(h.Properties) == 0 {
		return append(dst, 0, 0)
	}
	return append(dst, h.Properties...)
}

// Property flags of class basic, in the first flags word. Bit 0 is the
// continuation flag: another flags word follows. Bit 1 is unused; RabbitMQ
// ignores it and so do we.
const (
	FlagContentType     uint16 = 0x8000
	FlagContentEncoding uint16 = 0x4000
	FlagHeaders         uint16 = 0x2000
	FlagDeliveryMode    uint16 = 0x1000
	FlagPriority        uint16 = 0x0800
	FlagCorrelationID   uint16 = 0x0400
	FlagReplyTo         uint16 = 0x0200
	FlagExpiration      uint16 = 0x0100
	FlagMessageID       uint16 = 0x0080
	FlagTimestamp       uint16 = 0x0040
	FlagType            uint16 = 0x0020
	FlagUserID          uint16 = 0x0010
	FlagAppID           uint16 = 0x0008
	FlagClusterID       uint16 = 0x0004
	FlagContinuation    uint16 = 0x0001

	flagsKnown = 0xFFFC
)

// Properties are the basic class's content properties.
type Properties struct {
	ContentType     string
	ContentEncoding string
	Headers         Table // aliases the raw properties it was decoded from
	DeliveryMode    uint8
	Priority        uint8
	CorrelationID   string
	ReplyTo         string
	Expiration      string
	MessageID       string
	Timestamp       uint64
	Type            string
	UserID          string
	AppID           string
	ClusterID       string
	// Flags says which properties are present (Flag* bits), including
	// present-but-empty ones.
	Flags uint16
}

// propKind is the wire type of each property, in flag order from bit 15.
var propKinds = [14]byte{'s', 's', 'F', 'o', 'o', 's', 's', 's', 's', 'T', 's', 's', 's', 's'}

// propFlag is the flag of property i (0 = content-type).
func propFlag(i int) uint16 { return 0x8000 >> i }

// propLayout is where each part of a raw property block (flags words then
// list) lies: spans[i] is the [start, end) of property i's value, 0,0 when
// absent; list is where the list starts, after the flags words, and end
// where it ends.
type propLayout struct {
	flags uint16 // the first flags word, without the continuation bit
	spans [14][2]int
	list  int
	end   int
}

// layout finds each part of raw, checking lengths only: no value is decoded
// or validated.
func layout(raw []byte) (propLayout, error) {
	var l propLayout
	if len(raw) < 2 {
		return l, &Error{Code: FrameError, Text: "properties: no flags word", cause: ErrShort}
	}
	flags := binary.BigEndian.Uint16(raw)
	off := 2
	for cont := flags&FlagContinuation != 0; cont; off += 2 {
		if len(raw) < off+2 {
			return l, &Error{Code: FrameError, Text: "properties: flags continue past the end", cause: ErrShort}
		}
		w := binary.BigEndian.Uint16(raw[off:])
		if w&^FlagContinuation != 0 {
			return l, &Error{Code: FrameError, Text: "properties: unknown property in flags word " + strconv.Itoa(off/2+1), cause: ErrFieldType}
		}
		cont = w&FlagContinuation != 0
	}
	l.flags, l.list = flags&^FlagContinuation, off
	for i, kind := range propKinds {
		if flags&propFlag(i) == 0 {
			continue
		}
		var n int
		switch kind {
		case 'o':
			n = 1
		case 'T':
			n = 8
		case 's':
			if off < len(raw) {
				n = 1 + int(raw[off])
			} else {
				n = 1
			}
		case 'F':
			if len(raw)-off >= 4 {
				size := binary.BigEndian.Uint32(raw[off:])
				if uint64(size) > uint64(len(raw)-off-4) {
					n = math.MaxInt
				} else {
					n = 4 + int(size)
				}
			} else {
				n = 4
			}
		}
		if n > len(raw)-off {
			return l, &Error{Code: FrameError, Text: "properties: " + propNames[i] + " truncated", cause: ErrShort}
		}
		l.spans[i] = [2]int{off, off + n}
		off += n
	}
	l.end = off
	return l, nil
}

// layoutWhole is layout that also refuses bytes after the list.
func layoutWhole(raw []byte) (propLayout, error) {
	l, err := layout(raw)
	if err == nil && l.end != len(raw) {
		err = &Error{Code: FrameError, Text: "properties: " + strconv.Itoa(len(raw)-l.end) + " bytes after the list", cause: ErrTrailing}
	}
	return l, err
}

var propNames = [14]string{"content-type", "content-encoding", "headers", "delivery-mode", "priority",
	"correlation-id", "reply-to", "expiration", "message-id", "timestamp", "type", "user-id", "app-id", "cluster-id"}

// DecodeProperties decodes a raw property block (flags words and list, as
// in ContentHeader.Properties). Errors are *Error with 501 FRAME_ERROR: a
// truncated list, bytes after it, a property flag in a continuation word
// (basic has no such property), or a malformed headers table.
func DecodeProperties(raw []byte) (Properties, error) {
	l, err := layoutWhole(raw)
	if err != nil {
		return Properties{}, err
	}
	spans := l.spans
	p := Properties{Flags: l.flags & flagsKnown}
	str := func(i int) string {
		s := spans[i]
		if s[1]-s[0] <= 1 {
			return ""
		}
		return string(raw[s[0]+1 : s[1]])
	}
	p.ContentType = str(0)
	p.ContentEncoding = str(1)
	if s := spans[2]; s[1]-s[0] > 4 {
		p.Headers = Table(raw[s[0]+4 : s[1] : s[1]])
		if err := p.Headers.Validate(); err != nil {
			return Properties{}, entryError([]byte("headers"), err)
		}
	}
	if s := spans[3]; s[1] > s[0] {
		p.DeliveryMode = raw[s[0]]
	}
	if s := spans[4]; s[1] > s[0] {
		p.Priority = raw[s[0]]
	}
	p.CorrelationID = str(5)
	p.ReplyTo = str(6)
	p.Expiration = str(7)
	p.MessageID = str(8)
	if s := spans[9]; s[1] > s[0] {
		p.Timestamp = binary.BigEndian.Uint64(raw[s[0]:])
	}
	p.Type = str(10)
	p.UserID = str(11)
	p.AppID = str(12)
	p.ClusterID = str(13)
	return p, nil
}

// AppendWithHeader appends to dst the raw property block props (flags words
// and list, as in ContentHeader.Properties) with one header set: name =
// field, where field is a field-table value as it stands in an entry, type
// code then value ('l' and 8 bytes, say). Everything else is the peer's own
// bytes: the flags words (with the headers flag set), every other property,
// every other header entry in its place. The first entry named name takes
// field where it stands: overwritten in the copy when its value has field's
// size, so nothing moves, and the headers table rewritten around it
// otherwise. Later entries of that name are dropped (a consumer decoding
// into a map would see the last one); with none, the entry goes last. No
// value is decoded: the block's structure and the headers entries' lengths
// are checked, not what the entries hold.
//
// Errors are *Error: those of DecodeProperties for the block, 501
// FRAME_ERROR naming headers for an entry that cannot be parsed, 502
// SYNTAX_ERROR for a name over 255 bytes (ErrTooLong) or a field that is
// not one well-formed value (ErrBadValue). dst is returned unchanged then.
func AppendWithHeader(dst, props []byte, name string, field []byte) ([]byte, error) {
	if len(name) > math.MaxUint8 {
		return dst, &Error{Code: SyntaxError, Text: "header name of " + strconv.Itoa(len(name)) + " bytes", cause: ErrTooLong}
	}
	if err := checkField(field); err != nil {
		return dst, err
	}
	l, err := layoutWhole(props)
	if err != nil {
		return dst, err
	}
	h := l.spans[2] // headers: 4-byte length, then the entries
	var old Table
	if h[1]-h[0] > 4 {
		old = Table(props[h[0]+4 : h[1]])
	}
	at, size, found, again, err := old.find(name)
	if err != nil {
		return dst, entryError([]byte("headers"), err)
	}
	if found && !again && size == len(field) {
		n := len(dst)
		dst = append(dst, props...)
		copy(dst[n+h[0]+4+at:], field)
		return dst, nil
	}
	// The headers table is rewritten; what precedes it (flags words,
	// content-type, content-encoding) and what follows is copied.
	before := l.list
	for _, s := range l.spans[:2] {
		if s[1] > s[0] {
			before = s[1]
		}
	}
	after := before
	if h[1] > h[0] {
		after = h[1]
	}
	n := len(dst)
	dst = append(dst, props[:before]...)
	dst[n] |= byte(FlagHeaders >> 8)
	dst = append(dst, 0, 0, 0, 0)
	start := len(dst)
	dst = old.appendWith(dst, name, field)
	if uint64(len(dst)-start) > math.MaxUint32 {
		return dst[:n], &Error{Code: SyntaxError, Text: "headers table of " + strconv.Itoa(len(dst)-start) + " bytes", cause: ErrTooLong}
	}
	binary.BigEndian.PutUint32(dst[start-4:start], uint32(len(dst)-start))
	return append(dst, props[after:l.end]...), nil
}

// PropertyHeaders returns the headers table of a raw property block (flags
// words and list, as in ContentHeader.Properties) without decoding
// anything: it skips content-type and content-encoding, the only
// properties before it. ok is false when the headers flag is not set or the
// block is too short for what its flags announce.
func PropertyHeaders(raw []byte) (t Table, ok bool) {
	if len(raw) < 2 {
		return nil, false
	}
	flags := binary.BigEndian.Uint16(raw)
	if flags&FlagHeaders == 0 {
		return nil, false
	}
	off := 2
	for cont := flags&FlagContinuation != 0; cont; off += 2 {
		if len(raw) < off+2 {
			return nil, false
		}
		cont = binary.BigEndian.Uint16(raw[off:])&FlagContinuation != 0
	}
	for i := range 2 { // content-type, content-encoding: shortstr
		if flags&propFlag(i) == 0 {
			continue
		}
		if off >= len(raw) {
			return nil, false
		}
		off += 1 + int(raw[off])
	}
	if len(raw)-off < 4 {
		return nil, false
	}
	size := binary.BigEndian.Uint32(raw[off:])
	if uint64(size) > uint64(len(raw)-off-4) {
		return nil, false
	}
	return Table(raw[off+4 : off+4+int(size)]), true
}
