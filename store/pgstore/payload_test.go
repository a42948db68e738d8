package pgstore

import (
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	"github.com/delayproxy/delayproxy/store"
)

// TestPayloadRoundTrip: the keys a Put announces come back in order, over
// as many payloads as PostgreSQL's limit needs, each under it.
func TestPayloadRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 2, 229, 230, 1000} {
		var keys []Announced
		for i := range n {
			keys = append(keys, Announced{store.MakeKey(int64(i)*7, uint8(i), uint64(i)), i % Partitions})
		}
		var got []Announced
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

// TestParsePayloadWords: each word is a partition and a key, or a key
// alone (a node of schema version 1), or skipped.
func TestParsePayloadWords(t *testing.T) {
	k := store.MakeKey(1, 2, 3)
	h := hex.EncodeToString(k[:])
	tests := []struct {
		payload string
		want    []Announced
	}{
		{"n 3." + h, []Announced{{k, 3}}},
		{"n " + h, []Announced{{k, -1}}},
		{"n 8." + h, nil},
		{"n -1." + h, nil},
		{"n 03." + h, nil},
		{"n x." + h, nil},
		{"n 3." + h[2:], nil},
		{"n 3.", nil},
		{"n .", nil},
		{"n 0." + h + " 7." + h, []Announced{{k, 0}, {k, 7}}},
	}
	for _, tt := range tests {
		if _, got := parsePayload(tt.payload); !slices.Equal(got, tt.want) {
			t.Errorf("parsePayload(%q) = %v, want %v", tt.payload, got, tt.want)
		}
	}
}

// FuzzParsePayload: any payload decodes without panicking to keys that
// encode back to words of it, in a partition there is.
func FuzzParsePayload(f *testing.F) {
	f.Add(notifyPayloads("abc", []Announced{{store.MakeKey(1, 2, 3), 0}, {store.MakeKey(4, 5, 6), 7}})[0])
	f.Add("node")
	f.Add("node zz 00")
	f.Add("node 1.zz 9.00")
	f.Add("")
	f.Fuzz(func(t *testing.T, payload string) {
		_, keys := parsePayload(payload)
		for _, a := range keys {
			if a.Partition < -1 || a.Partition >= Partitions {
				t.Fatalf("partition %d of %q", a.Partition, payload)
			}
			h := hex.EncodeToString(a.Key[:])
			if !strings.Contains(strings.ToLower(payload), h) {
				t.Fatalf("key %x is not in %q", a.Key, payload)
			}
		}
	})
}
