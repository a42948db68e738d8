package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
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
		raw := p.Append(nil)
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
		got, err = DecodeProperties(empty.Append(nil))
		if err != nil || !reflect.DeepEqual(got, empty) {
			t.Fatalf("%s present but empty: %+v, %v", propNames[i], got, err)
		}
	}
	raw := full.Append(nil)
	got, err := DecodeProperties(raw)
	if err != nil || !reflect.DeepEqual(got, full) {
		t.Fatalf("all properties: %+v, %v", got, err)
	}
	if again := got.Append(nil); !bytes.Equal(again, raw) {
		t.Fatal("all properties: re-encode differs")
	}
}

func TestPropertiesWireBytes(t *testing.T) {
	p := Properties{ContentType: "a", DeliveryMode: 2, Timestamp: 1}
	if got := hex.EncodeToString(p.Append(nil)); got != "9040"+"0161"+"02"+"0000000000000001" {
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

func TestPropertiesCheck(t *testing.T) {
	p := fullProperties(t)
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	p.ReplyTo = strings.Repeat("r", 256)
	if err := p.Check(); !errors.Is(err, ErrTooLong) {
		t.Fatalf("Check = %v", err)
	}
	p = Properties{Headers: Table{1, 'k', 'Z'}}
	if err := p.Check(); !errors.Is(err, ErrFieldType) {
		t.Fatalf("Check = %v", err)
	}
}

func TestSetHeader(t *testing.T) {
	full := fullProperties(t)
	raw := full.Append(nil)
	orig := bytes.Clone(raw)
	out, err := SetHeader(raw, "x-delay", int64(-1500))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, orig) {
		t.Fatal("SetHeader modified its input")
	}
	got, err := DecodeProperties(out)
	if err != nil {
		t.Fatal(err)
	}
	if v, _, _ := got.Headers.Get("x-delay"); v != int64(-1500) {
		t.Fatalf("x-delay = %#v", v)
	}
	want := full
	want.Headers, _ = full.Headers.Set("x-delay", int64(-1500))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("other properties changed:\n got %+v\nwant %+v", got, want)
	}
	// The bytes around the headers are the original bytes.
	hs := 2 + 1 + len(full.ContentType) + 1 + len(full.ContentEncoding)
	oldEnd := hs + 4 + len(full.Headers)
	newEnd := hs + 4 + len(want.Headers)
	if !bytes.Equal(out[:hs], raw[:hs]) || !bytes.Equal(out[newEnd:], raw[oldEnd:]) {
		t.Fatal("bytes outside the headers table changed")
	}

	// No headers before: the flag is set and the table inserted in its place.
	p := Properties{ContentType: "a", Priority: 3}
	out, err = SetHeader(p.Append(nil), "x-delay", int64(-5))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hex.EncodeToString(out), "a800"+"0161"+"00000011"+entryHex("x-delay", "6cfffffffffffffffb")+"03"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// Nothing at all before.
	out, err = SetHeader(mustHex(t, "0000"), "k", true)
	if err != nil || hex.EncodeToString(out) != "2000"+"00000004"+entryHex("k", "7401") {
		t.Fatalf("empty: %x, %v", out, err)
	}
	// An empty continuation word is dropped: one flags word comes out.
	out, err = SetHeader(mustHex(t, "8001"+"0000"+"0161"), "k", true)
	if err != nil || hex.EncodeToString(out) != "a000"+"0161"+"00000004"+entryHex("k", "7401") {
		t.Fatalf("continuation: %x, %v", out, err)
	}
	for _, bad := range []string{"", "80", "8000", "8000016100"} {
		if _, err := SetHeader(mustHex(t, bad), "k", true); err == nil {
			t.Errorf("SetHeader(%s) accepted", bad)
		}
	}
	if _, err := SetHeader(mustHex(t, "0000"), "k", struct{}{}); !errors.Is(err, ErrBadValue) {
		t.Errorf("bad value: %v", err)
	}
}
