package releaser

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/store"
)

// prop is one property of a raw property block: its flag and its value as
// on the wire.
type prop struct {
	flag uint16
	val  []byte
}

// properties encodes ps as a client does: one flags word, then the values.
// ps come in flag order, highest bit first.
func properties(ps ...prop) []byte {
	var flags uint16
	var list []byte
	for _, p := range ps {
		flags |= p.flag
		list = append(list, p.val...)
	}
	return append(binary.BigEndian.AppendUint16(nil, flags), list...)
}

func contentType(s string) prop     { return prop{wire.FlagContentType, shortstr(s)} }
func contentEncoding(s string) prop { return prop{wire.FlagContentEncoding, shortstr(s)} }
func headers(entries ...[]byte) prop {
	return prop{wire.FlagHeaders, longstr(string(concat(entries...)))}
}
func deliveryMode(v byte) prop    { return prop{wire.FlagDeliveryMode, []byte{v}} }
func priority(v byte) prop        { return prop{wire.FlagPriority, []byte{v}} }
func correlationID(s string) prop { return prop{wire.FlagCorrelationID, shortstr(s)} }
func messageID(s string) prop     { return prop{wire.FlagMessageID, shortstr(s)} }
func timestamp(v uint64) prop     { return prop{wire.FlagTimestamp, be64(int64(v))} }
func messageType(s string) prop   { return prop{wire.FlagType, shortstr(s)} }
func appID(s string) prop         { return prop{wire.FlagAppID, shortstr(s)} }
func shortstr(s string) []byte    { return append([]byte{byte(len(s))}, s...) }
func longstr(s string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
}
func be32(v int32) []byte           { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
func be64(v int64) []byte           { return binary.BigEndian.AppendUint64(nil, uint64(v)) }
func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// entry is one field-table entry: name, type code, value.
func entry(name string, typ byte, val []byte) []byte {
	return concat(shortstr(name), []byte{typ}, val)
}

// getRaw takes the next message from queue with a raw AMQP client and
// returns its properties and body exactly as RabbitMQ delivered them.
func getRaw(t *testing.T, queue string) (props, body []byte) {
	t.Helper()
	c, err := rawamqp.DialURL(testbroker.URL(t), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err := c.Send(1, &wire.BasicGet{Queue: queue, NoAck: true}); err != nil {
			t.Fatal(err)
		}
		_, m, err := c.Next()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*wire.BasicGetOk); !ok {
			continue
		}
		f, _, err := c.Next()
		if err != nil || f.Type != wire.FrameHeader {
			t.Fatalf("after basic.get-ok: frame type %d, %v", f.Type, err)
		}
		h, err := wire.DecodeContentHeader(f.Payload)
		if err != nil {
			t.Fatal(err)
		}
		props = bytes.Clone(h.Properties)
		for uint64(len(body)) < h.BodySize {
			f, _, err := c.Next()
			if err != nil || f.Type != wire.FrameBody {
				t.Fatalf("body frame: type %d, %v", f.Type, err)
			}
			body = append(body, f.Payload...)
		}
		return props, body
	}
	t.Fatal("no message arrived")
	return nil, nil
}

// TestReleasedPropertiesByteExact: the released message's properties are
// the client's own bytes, every header in its place with its type, and only
// x-delay set to -Delay, of the type asked for.
func TestReleasedPropertiesByteExact(t *testing.T) {
	f := newFixture(t, "direct")
	// Headers in an order no encoder that sorts would write, with types
	// amqp091-go would never choose.
	zeta := entry("zeta", 'S', longstr("first, though last in order"))
	big := entry("big", 'l', be64(1<<40))
	price := entry("price", 'D', []byte{2, 0, 0, 0x30, 0x39}) // 123.45
	nested := entry("nested", 'F', longstr(string(concat(
		entry("i", 'I', be32(-5)), entry("b", 'b', []byte{0xfe}), entry("s", 's', []byte{0, 9}),
		entry("deep", 'F', longstr(string(entry("t", 't', []byte{1}))))))))
	list := entry("list", 'A', longstr(string(concat(
		[]byte{'I'}, be32(1), []byte{'S'}, longstr("two"), []byte{'l'}, be64(3), []byte{'d'}, be64(int64(math.Float64bits(0.5)))))))
	raw := entry("raw", 'x', longstr("\x00\x01\xff"))
	when := entry("when", 'T', be64(1700000000))
	stored := func(delay ...[]byte) []byte {
		return properties(contentType("application/json"), contentEncoding("identity"),
			headers(concat(zeta, concat(delay...), big, price, nested, list, raw, when)),
			deliveryMode(2), priority(4), correlationID("c-9"), messageID("m-1"), timestamp(1700000001),
			messageType("order.created"), appID("shop"))
	}
	const lateDelay = 1<<31 + 1 // does not fit an int32 once negated
	tests := []struct {
		name      string
		delayType DelayType
		delay     int64
		stored    []byte // the client's x-delay entries
		released  []byte // the released x-delay entry
	}{
		{"'I' from the client is released as 'l'", "", 1500,
			entry("x-delay", 'I', be32(1500)), entry("x-delay", 'l', be64(-1500))},
		{"'l' from the client", DelayInt64, 1500,
			entry("x-delay", 'l', be64(1500)), entry("x-delay", 'l', be64(-1500))},
		{"a numeric string", DelayInt64, 2500,
			entry("x-delay", 'S', longstr("2500")), entry("x-delay", 'l', be64(-2500))},
		{"a later duplicate is dropped", DelayInt64, 1500,
			concat(entry("x-delay", 'I', be32(1500)), entry("x-delay", 'S', longstr("9"))), entry("x-delay", 'l', be64(-1500))},
		{"int32 asked: 'I'", DelayInt32, 1500,
			entry("x-delay", 'I', be32(1500)), entry("x-delay", 'I', be32(-1500))},
		{"int32 asked, from 'l'", DelayInt32, 1500,
			entry("x-delay", 'l', be64(1500)), entry("x-delay", 'I', be32(-1500))},
		{"int32 asked, -2^31 still fits", DelayInt32, 1 << 31,
			entry("x-delay", 'l', be64(1<<31)), entry("x-delay", 'I', be32(math.MinInt32))},
		{"int32 asked, a delay that does not fit falls back to 'l'", DelayInt32, lateDelay,
			entry("x-delay", 'l', be64(lateDelay)), entry("x-delay", 'l', be64(-lateDelay))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReleaser(t, Config{DelayType: tt.delayType})
			m := message(f.exchange, "k", tt.delay, stored(tt.stored), "body")
			if got := r.Release(context.Background(), []*store.Message{m, m}); !got[0] || !got[1] {
				t.Fatalf("confirmed = %v", got)
			}
			got, body := getRaw(t, f.queue)
			if want := stored(tt.released); !bytes.Equal(got, want) || string(body) != "body" {
				t.Fatalf("released properties:\n got %x\nwant %x\nbody %q", got, want, body)
			}
			// The same release as amqp091-go decodes it.
			d := f.get(t)
			wantDelay := any(int64(-tt.delay))
			if tt.released[len("x-delay")+1] == 'I' {
				wantDelay = int32(-tt.delay)
			}
			want := amqp.Table{
				"zeta": "first, though last in order", "x-delay": wantDelay, "big": int64(1 << 40),
				"price":  amqp.Decimal{Scale: 2, Value: 12345},
				"nested": amqp.Table{"i": int32(-5), "b": int8(-2), "s": int16(9), "deep": amqp.Table{"t": true}},
				"list":   []any{int32(1), "two", int64(3), 0.5},
				"raw":    []byte{0, 1, 0xff},
				"when":   time.Unix(1700000000, 0),
			}
			for k, v := range d.Headers {
				if tv, ok := v.(time.Time); ok {
					d.Headers[k] = time.Unix(tv.Unix(), 0)
				}
			}
			if !reflect.DeepEqual(d.Headers, want) {
				t.Fatalf("amqp091-go decodes the headers as\n%#v\nwant\n%#v", d.Headers, want)
			}
		})
	}
}

// TestReleaseAddsXDelayWhenAbsent: a stored message without x-delay (or
// without any header) gets one, last in the table.
func TestReleaseAddsXDelayWhenAbsent(t *testing.T) {
	f := newFixture(t, "direct")
	r := newReleaser(t, Config{})
	tests := []struct{ stored, want []byte }{
		{properties(messageID("a")), properties(headers(entry("x-delay", 'l', be64(-7))), messageID("a"))},
		{properties(headers(entry("k", 't', []byte{1})), priority(1)),
			properties(headers(entry("k", 't', []byte{1}), entry("x-delay", 'l', be64(-7))), priority(1))},
		{properties(), properties(headers(entry("x-delay", 'l', be64(-7))))},
	}
	for _, tt := range tests {
		if got := r.Release(context.Background(), []*store.Message{message(f.exchange, "k", 7, tt.stored, "")}); !got[0] {
			t.Fatal("not confirmed")
		}
		if got, _ := getRaw(t, f.queue); !bytes.Equal(got, tt.want) {
			t.Fatalf("released properties of %x:\n got %x\nwant %x", tt.stored, got, tt.want)
		}
	}
}
