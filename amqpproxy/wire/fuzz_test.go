package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
)

// seedFrames are valid and broken frames and payloads shared by the fuzz
// targets' seed corpora (testdata/fuzz holds more, captured from amqp091-go
// and RabbitMQ).
func seedMethods() [][]byte {
	args, _ := EncodeTable(map[string]any{"x-delayed-type": "direct", "n": int32(1), "a": []any{int8(1), "s"}, "f": map[string]any{"k": true}})
	var out [][]byte
	for _, m := range []Method{
		&BasicPublish{Exchange: "ex", RoutingKey: "rk", Mandatory: true},
		&ExchangeDeclare{Exchange: "d", Type: "x-delayed-message", Durable: true, Arguments: args},
		&ConnectionStartOk{ClientProperties: args, Mechanism: "PLAIN", Response: []byte("\x00u\x00p"), Locale: "en_US"},
		&BasicDeliver{ConsumerTag: "ctag", DeliveryTag: 9, Exchange: "e", RoutingKey: "r"},
		&BasicAck{DeliveryTag: 3, Multiple: true},
		&ConnectionClose{ReplyCode: 320, ReplyText: "CONNECTION_FORCED - bye"},
		&TxCommit{},
	} {
		out = append(out, AppendMethod(nil, m))
	}
	out = append(out, []byte{0, 60, 3, 231}, []byte{0, 60}, []byte{0, 60, 0, 10, 0, 0, 0, 0, 0, 1, 0xff},
		[]byte{0, 40, 0, 10, 0, 0, 1, 'x', 1, 'd', 0, 0xff, 0xff, 0xff, 0xff})
	return out
}

func seedProperties() [][]byte {
	headers, _ := EncodeTable(map[string]any{"x-delay": int32(1500), "arr": []any{nil, 1.5}, "dec": Decimal{Scale: 1, Value: 5}})
	p := Properties{ContentType: "text/plain", Headers: headers, DeliveryMode: 2, Priority: 9, MessageID: "m",
		Timestamp: 1, AppID: "a", ClusterID: "c", Flags: FlagCorrelationID}
	return [][]byte{appendProperties(nil, p), {0, 0}, {0x80, 1, 0, 0, 1, 'a'}, {0x20, 0, 0xff, 0xff, 0xff, 0xff}, {0x80, 2, 1, 'a'}}
}

func FuzzReadFrame(f *testing.F) {
	var stream []byte
	for _, p := range seedMethods() {
		stream = AppendFrame(stream, Frame{Type: FrameMethod, Channel: 1, Payload: p})
	}
	stream = AppendFrame(stream, Frame{Type: FrameHeader, Channel: 1, Payload: AppendContentHeader(nil, ContentHeader{ClassID: 60, BodySize: 3, Properties: seedProperties()[0]})})
	stream = AppendFrame(stream, Frame{Type: FrameBody, Channel: 1, Payload: []byte("abc")})
	stream = AppendFrame(stream, Frame{Type: FrameHeartbeat})
	f.Add([]byte{0}, stream)
	f.Add([]byte{3, 0, 200}, stream)
	f.Add([]byte{}, []byte{FrameBody, 0, 1, 0xff, 0xff, 0xff, 0xff, 1, 2, 3})
	f.Add([]byte{1}, []byte{FrameHeartbeat, 0, 1, 0, 0, 0, 0, FrameEnd})
	f.Add([]byte{1}, []byte{FrameMethod, 0, 1, 0, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, split, stream []byte) {
		max := uint32(0)
		if len(split) > 0 && split[0]&1 == 1 {
			max = FrameMinSize
		}
		r := NewReader(&chunkReader{data: stream, sizes: split}, max)
		var again []byte
		for {
			fr, err := r.ReadFrame()
			if err != nil {
				var e *Error
				if !errors.As(err, &e) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				if err == io.EOF && !bytes.Equal(again, stream) {
					t.Fatalf("clean EOF after %d of %d bytes", len(again), len(stream))
				}
				break
			}
			if max != 0 && len(fr.Payload)+FrameOverhead > int(max) {
				t.Fatalf("frame of %d bytes over frame_max %d", len(fr.Payload), max)
			}
			again = AppendFrame(again, fr)
			if !bytes.HasPrefix(stream, again) {
				t.Fatal("frames read do not re-encode to the stream")
			}
			switch fr.Type {
			case FrameMethod:
				DecodeMethod(fr.Payload)
			case FrameHeader:
				if h, err := DecodeContentHeader(fr.Payload); err == nil {
					DecodeProperties(h.Properties)
				}
			}
		}
	})
}

func FuzzDecodeMethod(f *testing.F) {
	for _, p := range seedMethods() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := DecodeMethod(payload)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || (e.Code != FrameError && e.Code != CommandInvalid) {
				t.Fatalf("error %v is not a 501 or 503 *Error", err)
			}
			return
		}
		id, _ := PeekMethodID(payload)
		if m.ID() != id || !id.Known() {
			t.Fatalf("decoded %v from %v", m.ID(), id)
		}
		again := AppendMethod(nil, m)
		// Canonical except for unused bits in bit octets, which decoding
		// ignores (as RabbitMQ does): same length, and equal once decoded.
		if len(again) != len(payload) {
			t.Fatalf("re-encoded to %d bytes, from %d", len(again), len(payload))
		}
		m2, err := DecodeMethod(again)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-encoded method decodes to %#v, %v; want %#v", m2, err, m)
		}
		if !bytes.Equal(AppendMethod(nil, m2), again) {
			t.Fatal("second encoding differs from the first")
		}
	})
}

func FuzzTable(f *testing.F) {
	for _, p := range seedMethods() {
		if m, err := DecodeMethod(p); err == nil {
			if d, ok := m.(*ExchangeDeclare); ok {
				f.Add([]byte(d.Arguments))
			}
		}
	}
	for _, p := range seedProperties() {
		if props, err := DecodeProperties(p); err == nil && props.Headers != nil {
			f.Add([]byte(props.Headers))
		}
	}
	f.Add([]byte{1, 'k', 'A', 0, 0, 0, 2, 'F', 0})
	f.Add([]byte{1, 'k', 'S', 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, raw []byte) {
		tb := Table(raw)
		valid := tb.Validate() == nil
		m, err := decodeTable(tb)
		if valid != (err == nil) {
			t.Fatalf("Validate says %v, Decode says %v", valid, err)
		}
		for _, name := range []string{"x-delay", "k", ""} {
			v, ok, err := tb.Get(name)
			if valid && err != nil {
				t.Fatalf("Get(%q) on a valid table: %v", name, err)
			}
			if valid && ok {
				if want, present := m[name]; !present || !sameValue(t, v, want) {
					t.Fatalf("Get(%q) = %#v, Decode has %#v", name, v, want)
				}
			}
		}
		if !valid {
			return
		}
		// What Decode gives, EncodeTable writes, and it decodes the same.
		enc, err := EncodeTable(m)
		if err != nil {
			t.Fatalf("EncodeTable of a decoded table: %v", err)
		}
		m2, err := decodeTable(enc)
		if err != nil {
			t.Fatal(err)
		}
		enc2, err := EncodeTable(m2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encode/decode is not stable: %v", err)
		}
	})
}

// sameValue compares decoded values by their encoding, so NaNs compare equal.
func sameValue(t *testing.T, a, b any) bool {
	ea, err1 := appendValue(nil, a, 0)
	eb, err2 := appendValue(nil, b, 0)
	if err1 != nil || err2 != nil {
		t.Fatalf("values do not encode: %v %v", err1, err2)
	}
	return bytes.Equal(ea, eb)
}

func FuzzContentHeader(f *testing.F) {
	for _, p := range seedProperties() {
		f.Add(AppendContentHeader(nil, ContentHeader{ClassID: 60, BodySize: 10, Properties: p}))
	}
	f.Add([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		h, err := DecodeContentHeader(payload)
		if err != nil {
			assertCode(t, err, FrameError, ErrShort)
			return
		}
		if again := AppendContentHeader(nil, h); !bytes.Equal(again, payload) {
			t.Fatalf("re-encoded to %x from %x", again, payload)
		}
		checkProperties(t, h.Properties)
	})
}

func FuzzProperties(f *testing.F) {
	for _, p := range seedProperties() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkProperties(t, raw) })
}

// fuzzDelay is the x-delay checkProperties sets: 'l' -42.
var fuzzDelay = []byte{'l', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd6}

func checkProperties(t *testing.T, raw []byte) {
	p, err := DecodeProperties(raw)
	out, setErr := AppendWithHeader(nil, raw, "x-delay", fuzzDelay)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Code != FrameError {
			t.Fatalf("error %v is not a 501 *Error", err)
		}
		if setErr == nil {
			// AppendWithHeader checks the property list's structure but
			// not inside headers entries it does not touch.
			if _, err := layoutWhole(out); err != nil {
				t.Fatalf("AppendWithHeader produced a malformed block: %v", err)
			}
		}
		return
	}
	again := appendProperties(nil, p)
	p2, err := DecodeProperties(again)
	if err != nil || !reflect.DeepEqual(p, p2) {
		t.Fatalf("re-encoded properties decode to %+v, %v; want %+v", p2, err, p)
	}
	// One flags word without the unused bit 1 is the canonical form.
	if binary.BigEndian.Uint16(raw)&(FlagContinuation|2) == 0 && !bytes.Equal(again, raw) {
		t.Fatalf("canonical properties re-encoded to %x from %x", again, raw)
	}
	if setErr != nil {
		t.Fatalf("AppendWithHeader on valid properties: %v", setErr)
	}
	q, err := DecodeProperties(out)
	if err != nil {
		t.Fatalf("AppendWithHeader output does not decode: %v", err)
	}
	// Every header but x-delay as it was, x-delay the new value, once.
	want, _ := decodeTable(p.Headers)
	want["x-delay"] = int64(-42)
	got, _ := decodeTable(q.Headers)
	if len(got) != len(want) {
		t.Fatalf("headers after AppendWithHeader: %v, want %v", got, want)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || !sameValue(t, g, v) {
			t.Fatalf("header %q after AppendWithHeader = %#v, want %#v", k, g, v)
		}
	}
	if _, _, found, again, _ := q.Headers.find("x-delay"); !found || again {
		t.Fatalf("x-delay found %v, repeated %v after AppendWithHeader", found, again)
	}
	// The other properties are untouched.
	p.Headers, q.Headers = nil, nil
	p.Flags |= FlagHeaders
	if !reflect.DeepEqual(q, p) {
		t.Fatalf("AppendWithHeader changed other properties:\n got %+v\nwant %+v", q, p)
	}
}

// FuzzPropertyHeaders: the raw scan of a property block for the headers
// table (PropertyHeaders), and of the table for a few names (Find), agree
// with the full decode wherever it succeeds, and never panic on any input.
func FuzzPropertyHeaders(f *testing.F) {
	for _, p := range seedProperties() {
		f.Add(p)
	}
	dt, _ := EncodeTable(map[string]any{"x-opt-delivery-time": int64(1_800_000_000_000), "x-opt-delivery-delay": uint8(5), "a": "b"})
	f.Add(appendProperties(nil, Properties{ContentType: "t", ContentEncoding: "e", Headers: dt, Priority: 3, Flags: FlagPriority}))
	names := []string{"x-opt-delivery-time", "x-opt-delivery-delay", "x-delay"}
	f.Fuzz(func(t *testing.T, raw []byte) {
		tb, ok := PropertyHeaders(raw)
		var found [3]any
		var seen [3]bool
		findErr := tb.Find(names, func(i int, v any) { found[i], seen[i] = v, true })
		p, err := DecodeProperties(raw)
		if err != nil {
			return
		}
		if ok != (p.Flags&FlagHeaders != 0) || !bytes.Equal(tb, p.Headers) {
			t.Fatalf("PropertyHeaders = %x, %v; DecodeProperties has %x (flags %04x)", tb, ok, p.Headers, p.Flags)
		}
		if findErr != nil {
			t.Fatalf("Find on a decoded table: %v", findErr)
		}
		for i, name := range names {
			v, present, err := p.Headers.Get(name)
			if err != nil || present != seen[i] || (present && !sameValue(t, v, found[i])) {
				t.Fatalf("Find(%q) = %#v, %v; Get = %#v, %v, %v", name, found[i], seen[i], v, present, err)
			}
		}
	})
}
