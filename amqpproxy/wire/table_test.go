package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// entryHex is one table entry, name then type code and value, in hex.
func entryHex(name, typeAndValue string) string {
	return hex.EncodeToString([]byte{byte(len(name))}) + hex.EncodeToString([]byte(name)) + typeAndValue
}

// decodeTable decodes every entry of t with Get's types. When a name
// repeats, the first entry wins, as Get and RabbitMQ's table lookup do.
func decodeTable(t Table) (map[string]any, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	m := make(map[string]any)
	for off := 0; off < len(t); {
		e, err := t.next(off, false)
		if err != nil {
			return nil, err
		}
		if _, dup := m[string(e.name)]; !dup {
			v, err := decodeValue(e.typ, e.val, 0)
			if err != nil {
				return nil, entryError(e.name, err)
			}
			m[string(e.name)] = v
		}
		off = e.end
	}
	return m, nil
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTableEveryType: each type code's wire form, its Go value, and both
// directions.
func TestTableEveryType(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		code  string
		value any
		hex   string // type code and value
	}{
		{"t", true, "7401"},
		{"t false", false, "7400"},
		{"b", int8(-2), "62fe"},
		{"B", uint8(200), "42c8"},
		{"s", int16(-2), "73fffe"},
		{"u", uint16(65535), "75ffff"},
		{"I", int32(-5000), "49ffffec78"},
		{"i", uint32(4000000000), "69ee6b2800"},
		{"l", int64(-5000), "6cffffffffffffec78"},
		{"f", float32(1.5), "663fc00000"},
		{"d", float64(-0.25), "64bfd0000000000000"},
		{"D", Decimal{Scale: 2, Value: -314}, "4402fffffec6"},
		{"S", "héllo", "5300000006" + hex.EncodeToString([]byte("héllo"))},
		{"S empty", "", "5300000000"},
		{"x", []byte{0, 1, 2}, "7800000003000102"},
		{"A", []any{int32(1), "a", []any{}, nil}, "4100000011" + "4900000001" + "530000000161" + "4100000000" + "56"},
		{"T", ts, "54" + hex.EncodeToString(appendLonglong(nil, uint64(ts.Unix())))},
		{"F", Table(mustHex(t, entryHex("k", "7401"))), "4600000004" + entryHex("k", "7401")},
		{"V", nil, "56"},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			want := mustHex(t, entryHex("key", tt.hex))
			got, err := EncodeTable(map[string]any{"key": tt.value})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encode:\n got %x\nwant %x", got, want)
			}
			if err := Table(want).Validate(); err != nil {
				t.Fatal(err)
			}
			v, ok, err := Table(want).Get("key")
			if err != nil || !ok || !reflect.DeepEqual(v, tt.value) {
				t.Fatalf("Get = %#v, %v, %v; want %#v", v, ok, err, tt.value)
			}
			m, err := decodeTable(Table(want))
			if err != nil || !reflect.DeepEqual(m, map[string]any{"key": tt.value}) {
				t.Fatalf("Decode = %#v, %v", m, err)
			}
			for n := 0; n < len(want); n++ {
				if err := Table(want[:n]).Validate(); n > 0 && err == nil {
					t.Fatalf("Validate accepts the %d-byte prefix %x", n, want[:n])
				} else if n > 0 {
					assertCode(t, err, FrameError, ErrShort)
				}
			}
		})
	}
}

func TestEncodeTableGoTypes(t *testing.T) {
	got, err := EncodeTable(map[string]any{
		"int":    5000,
		"nested": map[string]any{"b": uint8(1), "a": "x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := entryHex("int", "6c0000000000001388") +
		entryHex("nested", "460000000c"+entryHex("a", "530000000178")+entryHex("b", "4201"))
	if hex.EncodeToString(got) != want {
		t.Fatalf("got  %x\nwant %s", got, want)
	}
	for _, bad := range []any{uint64(1), struct{}{}, []string{"a"}, map[string]any{"x": uint(1)}, []any{make(chan int)}} {
		_, err := EncodeTable(map[string]any{"k": bad})
		if !errors.Is(err, ErrBadValue) {
			t.Errorf("EncodeTable(%T): %v, want ErrBadValue", bad, err)
		}
	}
	if _, err := EncodeTable(map[string]any{strings.Repeat("k", 256): 1}); !errors.Is(err, ErrTooLong) {
		t.Errorf("256-byte key: %v, want ErrTooLong", err)
	}
	if tb, err := EncodeTable(nil); err != nil || tb != nil {
		t.Errorf("EncodeTable(nil) = %x, %v", tb, err)
	}
	// Deterministic: the same map always gives the same bytes.
	m := map[string]any{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}
	first, _ := EncodeTable(m)
	for range 20 {
		if again, _ := EncodeTable(m); !bytes.Equal(again, first) {
			t.Fatal("EncodeTable is not deterministic")
		}
	}
}

func TestTableErrors(t *testing.T) {
	tests := []struct {
		name     string
		hex      string
		sentinel error
	}{
		{"unknown type", entryHex("k", "5a"), ErrFieldType},
		{"shortstr type code is not ours", entryHex("k", "7301"), ErrShort},
		{"name past end", "05616263", ErrShort},
		{"no type code", "016b", ErrShort},
		{"longstr overrun", entryHex("k", "53000000096161"), ErrShort},
		{"longstr of 4 GiB", entryHex("k", "53ffffffff61"), ErrShort},
		{"nested bad type", entryHex("k", "4600000003"+"016b5a"), ErrFieldType},
		{"array bad type", entryHex("k", "4100000001"+"5a"), ErrFieldType},
		{"array truncated value", entryHex("k", "4100000002"+"4900"), ErrShort},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := Table(mustHex(t, tt.hex))
			assertCode(t, tb.Validate(), FrameError, tt.sentinel)
			if _, err := decodeTable(tb); err == nil {
				t.Fatal("Decode accepted it")
			}
		})
	}
}

func TestTableDepth(t *testing.T) {
	nest := func(depth int) Table {
		tb := Table(mustHex(t, entryHex("v", "7401")))
		for range depth {
			tb = append(mustHex(t, entryHex("n", "46")), appendTable(nil, tb)...)
		}
		return tb
	}
	if err := nest(MaxTableDepth).Validate(); err != nil {
		t.Fatalf("depth %d: %v", MaxTableDepth, err)
	}
	assertCode(t, nest(MaxTableDepth+1).Validate(), FrameError, ErrTooDeep)
	// Arrays count as nesting too.
	arr := mustHex(t, "7401")
	for range MaxTableDepth + 1 {
		arr = append([]byte{'A'}, appendLongstr(nil, arr)...)
	}
	tb := append(mustHex(t, "0161"), arr...)
	assertCode(t, Table(tb).Validate(), FrameError, ErrTooDeep)

	// EncodeTable writes what Validate accepts, and no deeper.
	var m any = true
	for range MaxTableDepth + 1 {
		m = map[string]any{"n": m}
	}
	ok, err := EncodeTable(m.(map[string]any))
	if err != nil || ok.Validate() != nil {
		t.Fatalf("EncodeTable at the depth limit: %v", err)
	}
	m = map[string]any{"n": m}
	if _, err := EncodeTable(m.(map[string]any)); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("EncodeTable too deep: %v", err)
	}
	// A very deep table in a small buffer is refused quickly, without
	// recursing through all of it.
	deep := nest(2000)
	assertCode(t, deep.Validate(), FrameError, ErrTooDeep)
}

// TestTableHugeLengthNoAlloc: a declared length of 2^32-1 in a tiny buffer is
// refused without allocating for it.
func TestTableHugeLengthNoAlloc(t *testing.T) {
	for _, code := range []string{"53", "78", "46", "41"} {
		tb := Table(mustHex(t, entryHex("k", code+"ffffffff")))
		allocs := testing.AllocsPerRun(100, func() {
			if tb.Validate() == nil {
				t.Fatal("accepted")
			}
		})
		// The error names the entry: a few small allocations, never 4 GiB.
		if allocs > 4 {
			t.Errorf("type %s: %v allocations", code, allocs)
		}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for range 10 {
			tb.Get("k")
			decodeTable(tb)
		}
		runtime.ReadMemStats(&ms1)
		if d := ms1.TotalAlloc - ms0.TotalAlloc; d > 1<<20 {
			t.Errorf("type %s: %d bytes allocated", code, d)
		}
	}
}

func TestTableGetSkipsWithoutDecoding(t *testing.T) {
	// The first entry's nested table is malformed inside; Get of the second
	// entry does not look into it (it is forwarded raw), Validate does.
	tb := Table(mustHex(t, entryHex("raw", "4600000003016b5a")+entryHex("x-delay", "49000003e8")))
	v, ok, err := tb.Get("x-delay")
	if err != nil || !ok || v != int32(1000) {
		t.Fatalf("Get = %v, %v, %v", v, ok, err)
	}
	if _, ok, err := tb.Get("missing"); ok || err != nil {
		t.Fatalf("Get(missing) = %v, %v", ok, err)
	}
	if tb.Validate() == nil {
		t.Fatal("Validate accepted a bad nested table")
	}
	// Duplicates: the first one wins, in Get and Decode.
	dup := Table(mustHex(t, entryHex("a", "4201")+entryHex("a", "4202")))
	if v, _, _ := dup.Get("a"); v != uint8(1) {
		t.Fatalf("Get of a duplicate = %v", v)
	}
	if m, _ := decodeTable(dup); m["a"] != uint8(1) {
		t.Fatalf("Decode of a duplicate = %v", m)
	}
}

func TestTableFloatsAndTimestampExact(t *testing.T) {
	// Special float bit patterns and timestamps beyond int64 survive a
	// decode/encode cycle bit for bit.
	for _, h := range []string{
		entryHex("f", "667fc00001"), // a NaN payload
		entryHex("d", "64fff0000000000000"),
		entryHex("T", "54ffffffffffffffff"),
		entryHex("T", "548000000000000000"),
		entryHex("l", "6c8000000000000000"),
	} {
		raw := mustHex(t, h)
		m, err := decodeTable(Table(raw))
		if err != nil {
			t.Fatal(err)
		}
		again, err := EncodeTable(m)
		if err != nil || !bytes.Equal(again, raw) {
			t.Errorf("%s: re-encoded %x, %v", h, again, err)
		}
	}
}
