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
	// Flags says which properties are present (Flag* bits). DecodeProperties
	// sets it; Append writes every property whose flag is set or whose
	// value is not zero, so it is needed only for present-but-empty ones.
	Flags uint16
}

// propKind is the wire type of each property, in flag order from bit 15.
var propKinds = [14]byte{'s', 's', 'F', 'o', 'o', 's', 's', 's', 's', 'T', 's', 's', 's', 's'}

// propFlag is the flag of property i (0 = content-type).
func propFlag(i int) uint16 { return 0x8000 >> i }

// propSpans finds each present property in raw (flags words then list):
// spans[i] is the [start, end) of property i's value, 0,0 when absent. end
// is where the list ends.
func propSpans(raw []byte) (flags uint16, spans [14][2]int, end int, err error) {
	if len(raw) < 2 {
		return 0, spans, 0, &Error{Code: FrameError, Text: "properties: no flags word", cause: ErrShort}
	}
	flags = binary.BigEndian.Uint16(raw)
	off := 2
	for cont := flags&FlagContinuation != 0; cont; off += 2 {
		if len(raw) < off+2 {
			return 0, spans, 0, &Error{Code: FrameError, Text: "properties: flags continue past the end", cause: ErrShort}
		}
		w := binary.BigEndian.Uint16(raw[off:])
		if w&^FlagContinuation != 0 {
			return 0, spans, 0, &Error{Code: FrameError, Text: "properties: unknown property in flags word " + strconv.Itoa(off/2+1), cause: ErrFieldType}
		}
		cont = w&FlagContinuation != 0
	}
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
			return 0, spans, 0, &Error{Code: FrameError, Text: "properties: " + propNames[i] + " truncated", cause: ErrShort}
		}
		spans[i] = [2]int{off, off + n}
		off += n
	}
	return flags &^ FlagContinuation, spans, off, nil
}

var propNames = [14]string{"content-type", "content-encoding", "headers", "delivery-mode", "priority",
	"correlation-id", "reply-to", "expiration", "message-id", "timestamp", "type", "user-id", "app-id", "cluster-id"}

// DecodeProperties decodes a raw property block (flags words and list, as
// in ContentHeader.Properties). Errors are *Error with 501 FRAME_ERROR: a
// truncated list, bytes after it, a property flag in a continuation word
// (basic has no such property), or a malformed headers table.
func DecodeProperties(raw []byte) (Properties, error) {
	flags, spans, end, err := propSpans(raw)
	if err != nil {
		return Properties{}, err
	}
	if end != len(raw) {
		return Properties{}, &Error{Code: FrameError, Text: "properties: " + strconv.Itoa(len(raw)-end) + " bytes after the list", cause: ErrTrailing}
	}
	p := Properties{Flags: flags & flagsKnown}
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

// present is the flags word Append writes.
func (p *Properties) present() uint16 {
	f := p.Flags & flagsKnown
	set := func(flag uint16, on bool) {
		if on {
			f |= flag
		}
	}
	set(FlagContentType, p.ContentType != "")
	set(FlagContentEncoding, p.ContentEncoding != "")
	set(FlagHeaders, len(p.Headers) > 0)
	set(FlagDeliveryMode, p.DeliveryMode != 0)
	set(FlagPriority, p.Priority != 0)
	set(FlagCorrelationID, p.CorrelationID != "")
	set(FlagReplyTo, p.ReplyTo != "")
	set(FlagExpiration, p.Expiration != "")
	set(FlagMessageID, p.MessageID != "")
	set(FlagTimestamp, p.Timestamp != 0)
	set(FlagType, p.Type != "")
	set(FlagUserID, p.UserID != "")
	set(FlagAppID, p.AppID != "")
	set(FlagClusterID, p.ClusterID != "")
	return f
}

// Append appends the flags word and the property list to dst: one flags
// word, every property whose flag is set or whose value is not zero.
// Shortstrs longer than 255 bytes are cut, as Method.Append does; Check
// reports them.
func (p *Properties) Append(dst []byte) []byte {
	f := p.present()
	dst = binary.BigEndian.AppendUint16(dst, f)
	if f&FlagContentType != 0 {
		dst = appendShortstr(dst, p.ContentType)
	}
	if f&FlagContentEncoding != 0 {
		dst = appendShortstr(dst, p.ContentEncoding)
	}
	if f&FlagHeaders != 0 {
		dst = appendTable(dst, p.Headers)
	}
	if f&FlagDeliveryMode != 0 {
		dst = append(dst, p.DeliveryMode)
	}
	if f&FlagPriority != 0 {
		dst = append(dst, p.Priority)
	}
	if f&FlagCorrelationID != 0 {
		dst = appendShortstr(dst, p.CorrelationID)
	}
	if f&FlagReplyTo != 0 {
		dst = appendShortstr(dst, p.ReplyTo)
	}
	if f&FlagExpiration != 0 {
		dst = appendShortstr(dst, p.Expiration)
	}
	if f&FlagMessageID != 0 {
		dst = appendShortstr(dst, p.MessageID)
	}
	if f&FlagTimestamp != 0 {
		dst = appendLonglong(dst, p.Timestamp)
	}
	if f&FlagType != 0 {
		dst = appendShortstr(dst, p.Type)
	}
	if f&FlagUserID != 0 {
		dst = appendShortstr(dst, p.UserID)
	}
	if f&FlagAppID != 0 {
		dst = appendShortstr(dst, p.AppID)
	}
	if f&FlagClusterID != 0 {
		dst = appendShortstr(dst, p.ClusterID)
	}
	return dst
}

// Check reports a property Append could not encode faithfully: a shortstr
// over 255 bytes or an invalid headers table (ErrTooLong, or the table's
// error).
func (p *Properties) Check() error {
	for _, s := range [...]struct{ name, v string }{
		{"content-type", p.ContentType}, {"content-encoding", p.ContentEncoding},
		{"correlation-id", p.CorrelationID}, {"reply-to", p.ReplyTo},
		{"expiration", p.Expiration}, {"message-id", p.MessageID}, {"type", p.Type},
		{"user-id", p.UserID}, {"app-id", p.AppID}, {"cluster-id", p.ClusterID},
	} {
		if err := checkShortstr(s.name, s.v); err != nil {
			return err
		}
	}
	return checkTable("headers", p.Headers)
}

// SetHeader returns a new raw property block (flags and list) in which
// headers[name] = v (v encoded as Table.Set does; an int64 is a signed
// 'l'). Every other property and every other header is copied byte-exact;
// the flags are written as one word. rawProps is not modified. Errors are
// those of DecodeProperties, or ErrTooLong/ErrBadValue for name and v.
func SetHeader(rawProps []byte, name string, v any) ([]byte, error) {
	flags, spans, end, err := propSpans(rawProps)
	if err != nil {
		return nil, err
	}
	if end != len(rawProps) {
		return nil, &Error{Code: FrameError, Text: "properties: " + strconv.Itoa(len(rawProps)-end) + " bytes after the list", cause: ErrTrailing}
	}
	var old Table
	if s := spans[2]; s[1]-s[0] > 4 {
		old = Table(rawProps[s[0]+4 : s[1] : s[1]])
	}
	// The list before headers is content-type and content-encoding; the
	// rest follows headers.
	listStart := end
	for _, s := range spans {
		if s[1] > s[0] {
			listStart = s[0]
			break
		}
	}
	before := listStart
	for i := 0; i < 2; i++ {
		if s := spans[i]; s[1] > s[0] {
			before = s[1]
		}
	}
	after := before
	if s := spans[2]; s[1] > s[0] {
		after = s[1]
	}
	out := make([]byte, 0, 2+(end-listStart)+len(name)+32)
	out = binary.BigEndian.AppendUint16(out, flags|FlagHeaders)
	out = append(out, rawProps[listStart:before]...)
	out = append(out, 0, 0, 0, 0)
	start := len(out)
	if out, err = old.appendSet(out, name, v); err != nil {
		return nil, err
	}
	if uint64(len(out)-start) > math.MaxUint32 {
		return nil, ErrTooLong
	}
	binary.BigEndian.PutUint32(out[start-4:start], uint32(len(out)-start))
	out = append(out, rawProps[after:end]...)
	return out, nil
}
