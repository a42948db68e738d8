package wire

import "testing"

// Micro-benchmarks of the relay's per-frame work. End-to-end figures live in
// bench/.

func publishFrames(b *testing.B) (method, header []byte) {
	headers, err := EncodeTable(map[string]any{"x-delay": int32(1500), "trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "attempt": int8(1)})
	if err != nil {
		b.Fatal(err)
	}
	p := Properties{ContentType: "application/json", Headers: headers, DeliveryMode: 2, Priority: 5, MessageID: "order-12345", Timestamp: 1700000000, AppID: "shop"}
	method = AppendMethod(nil, &BasicPublish{Exchange: "orders.delayed", RoutingKey: "order.created.eu"})
	header = AppendContentHeader(nil, ContentHeader{ClassID: 60, BodySize: 512, Properties: appendProperties(nil, p)})
	return method, header
}

func BenchmarkPeekMethodID(b *testing.B) {
	m, _ := publishFrames(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := PeekMethodID(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeMethod_BasicPublish(b *testing.B) {
	m, _ := publishFrames(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMethod(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBasicPublishDecode_Struct(b *testing.B) {
	m, _ := publishFrames(b)
	var p BasicPublish
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Decode(m[4:]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendMethod_BasicPublish(b *testing.B) {
	p := &BasicPublish{Exchange: "orders.delayed", RoutingKey: "order.created.eu"}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendMethod(buf[:0], p)
	}
}

func BenchmarkDecodeContentHeader(b *testing.B) {
	_, h := publishFrames(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeContentHeader(h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeProperties(b *testing.B) {
	_, h := publishFrames(b)
	raw := h[12:]
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeProperties(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTableGet(b *testing.B) {
	_, h := publishFrames(b)
	p, _ := DecodeProperties(h[12:])
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, err := p.Headers.Get("x-delay"); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkAppendWithHeader is the releaser's x-delay rewrite: 'I' to
// 'l', so the headers table is rewritten, into a reused buffer.
func BenchmarkAppendWithHeader(b *testing.B) {
	_, h := publishFrames(b)
	raw := h[12:]
	field := []byte{'l', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfa, 0x24}
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = AppendWithHeader(dst[:0], raw, "x-delay", field); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPropertyHeadersFind is what a relayed publish that carries a
// headers table pays for the delivery-time headers: find the table in the
// content header's properties and scan it for two names that are not
// there.
func BenchmarkPropertyHeadersFind(b *testing.B) {
	_, h := publishFrames(b)
	names := []string{"x-opt-delivery-time", "x-opt-delivery-delay"}
	found := 0
	fn := func(int, any) { found++ }
	b.ReportAllocs()
	for b.Loop() {
		t, ok := PropertyHeaders(h[12:])
		if !ok {
			b.Fatal("no headers")
		}
		if err := t.Find(names, fn); err != nil {
			b.Fatal(err)
		}
	}
	if found != 0 {
		b.Fatal("found a name that is not there")
	}
}
