package boltstore

import (
	"reflect"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

func FuzzDecodeMessage(f *testing.F) {
	for _, m := range []*store.Message{
		msg("x", base, 3, "body"),
		{VHost: "v", Exchange: "e", MessageID: "id", Mandatory: true, Delay: -5, Incarnation: 9},
		{},
	} {
		f.Add(encodeMessage(m))
	}
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff})
	f.Fuzz(func(t *testing.T, v []byte) {
		k := store.MakeKey(base, 1, 2)
		m, err := decodeMessage(k, v, true)
		if err != nil {
			return
		}
		// Re-encoding may differ in bytes (flags, varint padding) but must
		// decode to the same message.
		again, err := decodeMessage(k, encodeMessage(m), true)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, again)
		}
	})
}

func FuzzDecodeExchange(f *testing.F) {
	d := store.ExchangeDef{VHost: "/", Name: "x", DelayedType: "topic", Durable: true, Arguments: []byte{0, 0, 0, 1, 2}, Incarnation: 4}
	f.Add(exchangeKey(d.VHost, d.Name), encodeExchange(&d))
	dt := store.ExchangeDef{VHost: "/", Name: "", Kind: store.KindDeliveryTime, Incarnation: 5}
	f.Add(exchangeKey(dt.VHost, dt.Name), encodeExchange(&dt))
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, k, v []byte) {
		d, err := decodeExchange(k, v)
		if err != nil {
			return
		}
		again, err := decodeExchange(exchangeKey(d.VHost, d.Name), encodeExchange(&d))
		if err != nil {
			t.Fatalf("re-encoded definition does not decode: %v", err)
		}
		if !reflect.DeepEqual(again, d) {
			t.Fatalf("round trip changed the definition:\n%+v\n%+v", d, again)
		}
	})
}

// TestExchangeKindEncoding: a delayed exchange is encoded as before
// ExchangeKind existed (version 1), so files stay readable both ways; a
// delivery-time exchange is version 2 with its flag; a version and flag
// that disagree are corrupt.
func TestExchangeKindEncoding(t *testing.T) {
	k := exchangeKey("/", "x")
	for _, tc := range []struct {
		name      string
		v         []byte
		want      store.ExchangeKind
		wantError bool
	}{
		{name: "version 1 (before kinds)", v: []byte{1, defDurable, 0, 0, 0, 0, 0, 0, 0, 7, 6, 'd', 'i', 'r', 'e', 'c', 't'}, want: store.KindDelayed},
		{name: "version 2, delivery-time", v: []byte{2, defDeliveryTime, 0, 0, 0, 0, 0, 0, 0, 7, 0}, want: store.KindDeliveryTime},
		{name: "version 2 without the flag", v: []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0}, wantError: true},
		{name: "version 1 with the flag", v: []byte{1, defDeliveryTime, 0, 0, 0, 0, 0, 0, 0, 7, 0}, wantError: true},
		{name: "version 3", v: []byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0}, wantError: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := decodeExchange(k, tc.v)
			if tc.wantError {
				if err == nil {
					t.Fatalf("decoded %+v, want an error", d)
				}
				return
			}
			if err != nil || d.Kind != tc.want || d.Incarnation != 7 {
				t.Fatalf("decoded %+v, %v; want kind %d, incarnation 7", d, err, tc.want)
			}
			if again := encodeExchange(&d); !reflect.DeepEqual(again, tc.v) {
				t.Fatalf("re-encoded %v, want the same bytes %v", again, tc.v)
			}
		})
	}
}
