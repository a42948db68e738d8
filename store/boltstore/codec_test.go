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
