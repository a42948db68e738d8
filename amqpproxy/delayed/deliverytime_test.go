package delayed

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// TestDeliveryTimeHeaders: which header decides and what it asks for,
// for every value type, and the due time or refusal that follows.
func TestDeliveryTimeHeaders(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000).Add(300 * time.Microsecond) // ms 1_800_000_000_001 once rounded up
	const nowMs = 1_800_000_000_001
	tests := []struct {
		name    string
		headers map[string]any
		window  time.Duration
		header  string // "" when neither is read
		held    bool
		due     int64
		tooFar  bool
	}{
		{name: "no headers", headers: map[string]any{"a": int32(1)}},
		{name: "delay int8", headers: map[string]any{hDelay: int8(5)}, header: hDelay, held: true, due: nowMs + 5},
		{name: "delay uint8", headers: map[string]any{hDelay: uint8(200)}, header: hDelay, held: true, due: nowMs + 200},
		{name: "delay int16", headers: map[string]any{hDelay: int16(300)}, header: hDelay, held: true, due: nowMs + 300},
		{name: "delay uint16", headers: map[string]any{hDelay: uint16(65535)}, header: hDelay, held: true, due: nowMs + 65535},
		{name: "delay int32", headers: map[string]any{hDelay: int32(1000)}, header: hDelay, held: true, due: nowMs + 1000},
		{name: "delay uint32", headers: map[string]any{hDelay: uint32(3_000_000)}, header: hDelay, held: true, due: nowMs + 3_000_000},
		{name: "delay int64", headers: map[string]any{hDelay: int64(7)}, header: hDelay, held: true, due: nowMs + 7},
		{name: "delay zero", headers: map[string]any{hDelay: int32(0)}, header: hDelay},
		{name: "delay negative", headers: map[string]any{hDelay: int64(-1)}, header: hDelay},
		{name: "delay string: not read", headers: map[string]any{hDelay: "500"}},
		{name: "delay float: not read", headers: map[string]any{hDelay: 500.0}},
		{name: "delay decimal: not read", headers: map[string]any{hDelay: wire.Decimal{Value: 5}}},
		{name: "delay bool: not read", headers: map[string]any{hDelay: true}},
		{name: "delay timestamp: not read", headers: map[string]any{hDelay: time.Unix(5, 0)}},
		{name: "time int64", headers: map[string]any{hTime: int64(nowMs + 1)}, header: hTime, held: true, due: nowMs + 1},
		{name: "time now: at once", headers: map[string]any{hTime: int64(nowMs)}, header: hTime},
		{name: "time past", headers: map[string]any{hTime: int64(5)}, header: hTime},
		{name: "time uint32: 1970", headers: map[string]any{hTime: uint32(math.MaxUint32)}, header: hTime},
		{name: "time timestamp (seconds)", headers: map[string]any{hTime: time.Unix(1_800_000_100, 0)}, header: hTime, held: true, due: 1_800_000_100_000},
		{name: "time string: not read", headers: map[string]any{hTime: "1800000100000"}},
		{name: "time float: not read", headers: map[string]any{hTime: 1.8000001e12}},
		{name: "both: the time decides", headers: map[string]any{hTime: int64(nowMs + 50), hDelay: int32(5)}, header: hTime, held: true, due: nowMs + 50},
		{name: "both, the time past: at once", headers: map[string]any{hTime: int64(1), hDelay: int32(5)}, header: hTime},
		{name: "both, the time unread: the delay decides", headers: map[string]any{hTime: "x", hDelay: int32(5)}, header: hDelay, held: true, due: nowMs + 5},
		{name: "time windowed up", headers: map[string]any{hTime: int64(nowMs + 1)}, window: 10 * time.Millisecond, header: hTime, held: true, due: 1_800_000_000_010},
		{name: "delay beyond max", headers: map[string]any{hDelay: int64(time.Hour/time.Millisecond + 1)}, header: hDelay, held: true, tooFar: true},
		{name: "delay at max", headers: map[string]any{hDelay: int64(time.Hour / time.Millisecond)}, header: hDelay, held: true, due: nowMs + int64(time.Hour/time.Millisecond)},
		{name: "time beyond max", headers: map[string]any{hTime: int64(nowMs + int64(time.Hour/time.Millisecond) + 1)}, header: hTime, held: true, tooFar: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, err := wire.EncodeTable(tt.headers)
			if err != nil {
				t.Fatal(err)
			}
			header, v, err := readDeliveryTime(table)
			if err != nil || header != tt.header {
				t.Fatalf("readDeliveryTime = %q, %d, %v; want %q", header, v, err, tt.header)
			}
			d, held := deliveryDue(header, v, now, time.Hour, tt.window)
			if held != tt.held {
				t.Fatalf("held = %v, want %v", held, tt.held)
			}
			switch {
			case tt.tooFar:
				if !errors.Is(d.err, errDelayTooLong) || !containsHeader(d.err, header) {
					t.Fatalf("err = %v, want a 406 naming %s", d.err, header)
				}
			case d.err != nil || d.due != tt.due:
				t.Fatalf("due %d, err %v; want %d", d.due, d.err, tt.due)
			}
		})
	}
}

const (
	hTime  = headerDeliveryTime
	hDelay = headerDeliveryDelay
)

func containsHeader(err error, header string) bool {
	var we *wire.Error
	return errors.As(err, &we) && we.Code == wire.PreconditionFailed && len(we.Text) > len(header) && we.Text[:len(header)] == header
}

// FuzzReadDeliveryTime: any table, however malformed, is read without a
// panic; a value read is a header the table has.
func FuzzReadDeliveryTime(f *testing.F) {
	for _, h := range []map[string]any{
		{hTime: int64(1_800_000_000_000), hDelay: int32(5)},
		{hDelay: uint8(1), "a": "b"},
		{hTime: time.Unix(1, 0)},
	} {
		t, _ := wire.EncodeTable(h)
		f.Add([]byte(t))
	}
	f.Add([]byte{19, 'x', '-', 'o', 'p', 't', '-', 'd', 'e', 'l', 'i', 'v', 'e', 'r', 'y', '-', 't', 'i', 'm', 'e', 'l', 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		header, v, err := readDeliveryTime(wire.Table(raw))
		if err != nil || header == "" {
			return
		}
		if _, ok, _ := wire.Table(raw).Get(header); !ok {
			t.Fatalf("read %s = %d from a table without it", header, v)
		}
		deliveryDue(header, v, time.Now(), time.Hour, 10*time.Millisecond)
	})
}

// BenchmarkReadDeliveryTime is what the delayed layer spends on the
// headers of a publish to an ordinary exchange: a table without the
// delivery-time headers (the common case), and one with a delay.
func BenchmarkReadDeliveryTime(b *testing.B) {
	for _, tc := range []struct {
		name    string
		headers map[string]any
	}{
		{"absent", map[string]any{"trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "attempt": int8(1), "x-origin": "shop"}},
		{"delay", map[string]any{"trace-id": "4bf92f3577b34da6a3ce929d0e0e4736", "attempt": int8(1), hDelay: int32(1500)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			table, err := wire.EncodeTable(tc.headers)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := readDeliveryTime(table); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
