package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"
)

func TestContentHeader(t *testing.T) {
	props := mustHex(t, "8000"+"0161")
	h := ContentHeader{ClassID: 60, Weight: 0, BodySize: 1 << 33, Properties: props}
	payload := AppendContentHeader(nil, h)
	if got, want := hex.EncodeToString(payload), "003c"+"0000"+"0000000200000000"+"80000161"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	got, err := DecodeContentHeader(payload)
	if err != nil || !reflect.DeepEqual(got, h) {
		t.Fatalf("decode = %+v, %v", got, err)
	}
	if &got.Properties[0] != &payload[12] {
		t.Fatal("Properties does not alias the payload")
	}
	// No properties at all: a zero flags word.
	if p := AppendContentHeader(nil, ContentHeader{ClassID: 60}); hex.EncodeToString(p) != "003c00000000000000000000"+"0000" {
		t.Fatalf("empty properties: %x", p)
	}
	// Continuation words are walked but the list is not parsed.
	if _, err := DecodeContentHeader(mustHex(t, "003c000000000000000000000001"+"0000")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		"", "003c", "003c0000000000000000000000", // shorter than 12 or no flags word
		"003c0000000000000000000000" + "01",       // half a flags word
		"003c000000000000000000000001",            // continuation with no word after it
		"003c000000000000000000000001" + "000100", // two continuations, half a word
	} {
		_, err := DecodeContentHeader(mustHex(t, bad))
		assertCode(t, err, FrameError, ErrShort)
	}
	allocs := testing.AllocsPerRun(100, func() { DecodeContentHeader(payload) })
	if allocs != 0 {
		t.Errorf("DecodeContentHeader allocates %v times", allocs)
	}
}

func fullProperties(t testing.TB) Properties {
	headers, err := EncodeTable(map[string]any{"x-delay": int32(1500), "app": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	return Properties{
		ContentType: "application/json", ContentEncoding: "gzip", Headers: headers,
		DeliveryMode: 2, Priority: 9, CorrelationID: "corr", ReplyTo: "amq.rabbitmq.reply-to",
		Expiration: "60000", MessageID: "msg-1", Timestamp: 1700000000, Type: "order.created",
		UserID: "guest", AppID: "shop", ClusterID: "c1",
		Flags: 0xFFFC,
	}
}

func TestPropertiesEachFlag(t *testing.T) {
	full := fullProperties(t)
	fields := reflect.ValueOf(full)
	for i := range 14 {
		flag := propFlag(i)
		// Only property i, set through its value and also present-but-empty.
		var p Properties
		reflect.ValueOf(&p).Elem().Field(i).Set(fields.Field(i))
		raw := appendProperties(nil, p)
		if f := uint16(raw[0])<<8 | uint16(raw[1]); f != flag {
			t.Fatalf("%s: flags %04x, want %04x", propNames[i], f, flag)
		}
		got, err := DecodeProperties(raw)
		p.Flags = flag
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("%s: decode = %+v, %v", propNames[i], got, err)
		}
		for n := 2; n < len(raw); n++ {
			_, err := DecodeProperties(raw[:n])
			assertCode(t, err, FrameError, ErrShort)
		}
		_, err = DecodeProperties(append(raw, 0))
		assertCode(t, err, FrameError, ErrTrailing)

		empty := Properties{Flags: flag}
		got, err = DecodeProperties(appendProperties(nil, empty))
		if err != nil || !reflect.DeepEqual(got, empty) {
			t.Fatalf("%s present but empty: %+v, %v", propNames[i], got, err)
		}
	}
	raw := appendProperties(nil, full)
	got, err := DecodeProperties(raw)
	if err != nil || !reflect.DeepEqual(got, full) {
		t.Fatalf("all properties: %+v, %v", got, err)
	}
	if again := appendProperties(nil, got); !bytes.Equal(again, raw) {
		t.Fatal("all properties: re-encode differs")
	}
}

func TestPropertiesWireBytes(t *testing.T) {
	p := Properties{ContentType: "a", DeliveryMode: 2, Timestamp: 1}
	if got := hex.EncodeToString(appendProperties(nil, p)); got != "9040"+"0161"+"02"+"0000000000000001" {
		t.Fatalf("got %s", got)
	}
}

func TestPropertiesFlagWords(t *testing.T) {
	// Bit 1 is unused: RabbitMQ ignores it, and so do we.
	if p, err := DecodeProperties(mustHex(t, "8002"+"0161")); err != nil || p.ContentType != "a" || p.Flags != FlagContentType {
		t.Fatalf("bit 1: %+v, %v", p, err)
	}
	// An empty continuation word is valid per spec.
	if p, err := DecodeProperties(mustHex(t, "8001"+"0000"+"0161")); err != nil || p.ContentType != "a" {
		t.Fatalf("empty continuation word: %+v, %v", p, err)
	}
	// A property flag in a continuation word names a property basic lacks.
	_, err := DecodeProperties(mustHex(t, "8001"+"8000"+"0161"+"0162"))
	assertCode(t, err, FrameError, ErrFieldType)
	_, err = DecodeProperties(mustHex(t, "8001"))
	assertCode(t, err, FrameError, ErrShort)
	_, err = DecodeProperties(nil)
	assertCode(t, err, FrameError, ErrShort)
	// A bad headers table.
	_, err = DecodeProperties(mustHex(t, "2000"+"00000003"+"016b5a"))
	assertCode(t, err, FrameError, ErrFieldType)
	// Headers longer than what remains.
	_, err = DecodeProperties(mustHex(t, "2000"+"ffffffff"+"016b"))
	assertCode(t, err, FrameError, ErrShort)
}

func TestAppendWithHeader(t *testing.T) {
	// Entries with encodings we would never produce ourselves: a shortstr
	// code 's' used as int16, a decimal, a nested table with unsorted keys,
	// a duplicate key. Everything but x-delay must pass untouched.
	zz := entryHex("zz", "730102")
	delayI := entryHex("x-delay", "49000003e8") // 'I' 1000
	delayL := entryHex("x-delay", "6c00000000000003e8")
	nested := entryHex("n", "4600000008"+entryHex("q", "4201")+entryHex("a", "4202"))
	dec := entryHex("dec", "4402fffffec6")
	dupBool := entryHex("x-delay", "7401")
	long := "6cfffffffffffffc18" // 'l' -1000
	int32 := "49fffffc18"        // 'I' -1000
	table := func(entries ...string) string {
		s := strings.Join(entries, "")
		return hex.EncodeToString([]byte{0, 0, 0, byte(len(s) / 2)}) + s
	}
	before := "e800" + "0161" + "0167"    // content-type a, content-encoding g, headers, priority
	beforeNoH := "c800" + "0161" + "0167" // the same without headers
	after := "05"
	tests := []struct {
		name      string
		props     string
		field     string
		want      string
		sameBytes bool // patched in place: only the value's bytes differ
	}{
		{"same width: patched in place", before + table(zz, delayL, nested, dec) + after, long,
			before + table(zz, entryHex("x-delay", long), nested, dec) + after, true},
		{"'I' to 'l': table rewritten around it", before + table(zz, delayI, nested, dec) + after, long,
			before + table(zz, entryHex("x-delay", long), nested, dec) + after, false},
		{"'I' stays 'I'", before + table(zz, delayI, nested) + after, int32,
			before + table(zz, entryHex("x-delay", int32), nested) + after, true},
		{"a later duplicate is dropped", before + table(delayL, zz, dupBool, dec) + after, long,
			before + table(entryHex("x-delay", long), zz, dec) + after, false},
		{"no x-delay: appended last", before + table(zz, dec) + after, long,
			before + table(zz, dec, entryHex("x-delay", long)) + after, false},
		{"no headers: table inserted after content-encoding", beforeNoH + after, long,
			before + table(entryHex("x-delay", long)) + after, false},
		{"empty headers table", before + "00000000" + after, long,
			before + table(entryHex("x-delay", long)) + after, false},
		{"nothing at all", "0000", int32, "2000" + table(entryHex("x-delay", int32)), false},
		{"continuation word and unused bit 1 kept", "8003" + "0000" + "0161", long,
			"a003" + "0000" + "0161" + table(entryHex("x-delay", long)), false},
		{"only properties after headers", "0800" + "07", long,
			"2800" + table(entryHex("x-delay", long)) + "07", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			props, field := mustHex(t, tt.props), mustHex(t, tt.field)
			orig := bytes.Clone(props)
			prefix := []byte("dst")
			got, err := AppendWithHeader(prefix, props, "x-delay", field)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(props, orig) {
				t.Fatal("AppendWithHeader modified its input")
			}
			if !bytes.HasPrefix(got, prefix) {
				t.Fatal("dst was not kept")
			}
			if g := hex.EncodeToString(got[len(prefix):]); g != tt.want {
				t.Fatalf("got  %s\nwant %s", g, tt.want)
			}
			if _, err := DecodeProperties(got[len(prefix):]); err != nil {
				t.Fatalf("result does not decode: %v", err)
			}
			if tt.sameBytes != (len(got)-len(prefix) == len(props)) {
				t.Fatalf("in place = %v, want %v", !tt.sameBytes, tt.sameBytes)
			}
			if tt.sameBytes {
				dst := make([]byte, 0, len(props))
				if n := testing.AllocsPerRun(100, func() { AppendWithHeader(dst[:0], props, "x-delay", field) }); n != 0 {
					t.Errorf("patching in place allocates %v times", n)
				}
			}
		})
	}

	bad := []struct {
		name, props, field string
		code               uint16
		sentinel           error
	}{
		{"no flags word", "", long, FrameError, ErrShort},
		{"half a flags word", "80", long, FrameError, ErrShort},
		{"property missing", "8000", long, FrameError, ErrShort},
		{"bytes after the list", "8000016100", long, FrameError, ErrTrailing},
		{"headers entry cut short", "2000" + "00000003" + "016b49", long, FrameError, ErrShort},
		{"unknown type in headers", "2000" + "00000003" + "016b5a", long, FrameError, ErrFieldType},
		{"empty field", "0000", "", SyntaxError, ErrBadValue},
		{"unknown field type", "0000", "5a", SyntaxError, ErrBadValue},
		{"field cut short", "0000", "6c0000", SyntaxError, ErrBadValue},
		{"bytes after the field", "0000", "740100", SyntaxError, ErrBadValue},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("dst")
			got, err := AppendWithHeader(dst, mustHex(t, tt.props), "x-delay", mustHex(t, tt.field))
			assertCode(t, err, tt.code, tt.sentinel)
			if string(got) != "dst" {
				t.Fatalf("dst changed on error: %q", got)
			}
		})
	}
	_, err := AppendWithHeader(nil, mustHex(t, "0000"), strings.Repeat("k", 256), mustHex(t, long))
	assertCode(t, err, SyntaxError, ErrTooLong)
}

// appendProperties encodes p as clients do: one flags word, and every
// property whose flag is set or whose value is not zero.
func appendProperties(dst []byte, p Properties) []byte {
	strs := [14]string{0: p.ContentType, 1: p.ContentEncoding, 5: p.CorrelationID, 6: p.ReplyTo,
		7: p.Expiration, 8: p.MessageID, 10: p.Type, 11: p.UserID, 12: p.AppID, 13: p.ClusterID}
	set := [14]bool{2: len(p.Headers) > 0, 3: p.DeliveryMode != 0, 4: p.Priority != 0, 9: p.Timestamp != 0}
	flags := p.Flags & flagsKnown
	for i := range 14 {
		if strs[i] != "" || set[i] {
			flags |= propFlag(i)
		}
	}
	dst = binary.BigEndian.AppendUint16(dst, flags)
	for i, kind := range propKinds {
		if flags&propFlag(i) == 0 {
			continue
		}
		switch {
		case kind == 's':
			dst = appendShortstr(dst, strs[i])
		case kind == 'F':
			dst = appendTable(dst, p.Headers)
		case i == 3:
			dst = append(dst, p.DeliveryMode)
		case i == 4:
			dst = append(dst, p.Priority)
		case kind == 'T':
			dst = appendLonglong(dst, p.Timestamp)
		}
	}
	return dst
}
