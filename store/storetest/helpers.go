package storetest

import (
	"context"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// The helpers below serve the suite and the implementations' own tests
// alike: they fail the test on any error.

// Base is an arbitrary due time (2027, unix ms) that keeps tests off the
// wall clock.
const Base = int64(1_800_000_000_000)

// Message is a message of exchange in vhost "/" due at due, with body as its
// body and in its routing key, and a few bytes of properties.
func Message(exchange string, due int64, prio uint8, body string) *store.Message {
	return &store.Message{
		VHost: "/", Exchange: exchange, RoutingKey: "rk." + body, Due: due, Delay: 1000,
		Priority: prio, Body: []byte(body), Properties: []byte{0x80, 0x00, 0x03, 'a', '/', 'b'},
	}
}

// Exchange registers a durable direct delayed exchange.
func Exchange(t testing.TB, s store.Store, vhost, name string) store.ExchangeDef {
	t.Helper()
	d := store.ExchangeDef{VHost: vhost, Name: name, DelayedType: "direct", Durable: true, Arguments: []byte{0, 0, 0, 0}}
	if err := s.PutExchange(context.Background(), &d); err != nil {
		t.Fatalf("PutExchange: %v", err)
	}
	return d
}

// Put stores msgs with the live incarnation of their exchange, as the
// delayed layer does.
func Put(t testing.TB, s store.Store, msgs ...*store.Message) {
	t.Helper()
	for _, m := range msgs {
		d, ok := s.Exchange(m.VHost, m.Exchange)
		if !ok {
			t.Fatalf("Put: exchange %q in vhost %q is not registered", m.Exchange, m.VHost)
		}
		m.Incarnation = d.Incarnation
	}
	if err := s.Put(context.Background(), msgs...); err != nil {
		t.Fatalf("Put: %v", err)
	}
}

// Keys returns the key of every message due in [from, until), by ScanKeys.
func Keys(t testing.TB, s store.Store, from, until int64) []store.Key {
	t.Helper()
	var out []store.Key
	if err := s.ScanKeys(from, until, func(k store.Key) error { out = append(out, k); return nil }); err != nil {
		t.Fatalf("ScanKeys: %v", err)
	}
	return out
}

// Bodies reads keys and returns the bodies, "<nil>" for a key not stored.
func Bodies(t testing.TB, s store.Store, keys []store.Key) []string {
	t.Helper()
	ms, err := s.Get(keys)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if len(ms) != len(keys) {
		t.Fatalf("Get of %d keys returned %d results", len(keys), len(ms))
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		switch {
		case m == nil:
			out[i] = "<nil>"
		case m.Key != keys[i]:
			t.Fatalf("Get: result %d has key %x, want %x", i, m.Key[:], keys[i][:])
		default:
			out[i] = string(m.Body)
		}
	}
	return out
}
