package pgstore

import (
	"slices"
	"strings"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// TestPayloadRoundTrip: the keys a Put announces come back in order, over
// as many payloads as PostgreSQL's limit needs, each under it.
func TestPayloadRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 2, 229, 230, 1000} {
		var keys []store.Key
		for i := range n {
			keys = append(keys, store.MakeKey(int64(i)*7, uint8(i), uint64(i)))
		}
		var got []store.Key
		for _, p := range notifyPayloads("node1", keys) {
			if len(p) >= 8000 {
				t.Fatalf("%d keys: a payload of %d bytes", n, len(p))
			}
			node, ks := parsePayload(p)
			if node != "node1" {
				t.Fatalf("node %q", node)
			}
			got = append(got, ks...)
		}
		if !slices.Equal(got, keys) {
			t.Fatalf("%d keys: got back %d", n, len(got))
		}
	}
}

// FuzzParsePayload: any payload decodes without panicking to keys that
// encode back to words of it.
func FuzzParsePayload(f *testing.F) {
	f.Add(notifyPayloads("abc", []store.Key{store.MakeKey(1, 2, 3), store.MakeKey(4, 5, 6)})[0])
	f.Add("node")
	f.Add("node zz 00")
	f.Add("")
	f.Fuzz(func(t *testing.T, payload string) {
		_, keys := parsePayload(payload)
		for _, k := range keys {
			if p := notifyPayloads("n", []store.Key{k})[0]; !strings.Contains(strings.ToLower(payload), p[2:]) {
				t.Fatalf("key %x is not in %q", k, payload)
			}
		}
	})
}
