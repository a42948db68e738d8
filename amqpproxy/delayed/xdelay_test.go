package delayed

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

func TestParseDelay(t *testing.T) {
	const year = 365 * 24 * time.Hour
	tests := []struct {
		name     string
		headers  map[string]any // nil: no headers at all
		max      time.Duration
		wantMS   int64
		wantHeld bool
		wantCode uint16 // 0: no error
		wantErr  error
	}{
		{name: "no headers"},
		{name: "no x-delay", headers: map[string]any{"other": int32(5)}},
		{name: "int8", headers: map[string]any{"x-delay": int8(100)}, wantMS: 100, wantHeld: true},
		{name: "uint8", headers: map[string]any{"x-delay": uint8(200)}, wantMS: 200, wantHeld: true},
		{name: "int16", headers: map[string]any{"x-delay": int16(3000)}, wantMS: 3000, wantHeld: true},
		{name: "uint16", headers: map[string]any{"x-delay": uint16(60000)}, wantMS: 60000, wantHeld: true},
		{name: "int32", headers: map[string]any{"x-delay": int32(1500)}, wantMS: 1500, wantHeld: true},
		{name: "uint32 max", headers: map[string]any{"x-delay": uint32(math.MaxUint32)}, wantMS: math.MaxUint32, wantHeld: true},
		{name: "int64 beyond 2^32-1 is held", headers: map[string]any{"x-delay": int64(1) << 33}, max: 10 * year, wantMS: 1 << 33, wantHeld: true},
		{name: "numeric string", headers: map[string]any{"x-delay": "2500"}, wantMS: 2500, wantHeld: true},
		{name: "numeric string with spaces", headers: map[string]any{"x-delay": " 25 "}, wantMS: 25, wantHeld: true},
		{name: "float string truncated", headers: map[string]any{"x-delay": "12.9"}, wantMS: 12, wantHeld: true},
		{name: "float64 truncated", headers: map[string]any{"x-delay": 99.99}, wantMS: 99, wantHeld: true},
		{name: "float32", headers: map[string]any{"x-delay": float32(10.5)}, wantMS: 10, wantHeld: true},
		{name: "decimal", headers: map[string]any{"x-delay": wire.Decimal{Scale: 2, Value: 12345}}, wantMS: 123, wantHeld: true},
		{name: "zero routes at once", headers: map[string]any{"x-delay": int32(0)}},
		{name: "negative routes at once", headers: map[string]any{"x-delay": int32(-5000)}},
		{name: "negative string routes at once", headers: map[string]any{"x-delay": "-1"}},
		{name: "fraction below one ms routes at once", headers: map[string]any{"x-delay": 0.7}},
		{name: "not a number", headers: map[string]any{"x-delay": "abc"}, wantCode: wire.PreconditionFailed, wantErr: errInvalidDelay},
		{name: "empty string", headers: map[string]any{"x-delay": ""}, wantCode: wire.PreconditionFailed, wantErr: errInvalidDelay},
		{name: "bool", headers: map[string]any{"x-delay": true}, wantCode: wire.PreconditionFailed, wantErr: errInvalidDelay},
		{name: "NaN", headers: map[string]any{"x-delay": math.NaN()}, wantCode: wire.PreconditionFailed, wantErr: errInvalidDelay},
		{name: "infinite string", headers: map[string]any{"x-delay": "Inf"}, wantCode: wire.PreconditionFailed, wantErr: errInvalidDelay},
		{name: "above maximum", headers: map[string]any{"x-delay": int64(2 * year / time.Millisecond)}, max: year, wantCode: wire.PreconditionFailed, wantErr: errDelayTooLong},
		{name: "at maximum", headers: map[string]any{"x-delay": int64(year / time.Millisecond)}, max: year, wantMS: int64(year / time.Millisecond), wantHeld: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h wire.Table
			if tt.headers != nil {
				var err error
				if h, err = wire.EncodeTable(tt.headers); err != nil {
					t.Fatal(err)
				}
			}
			ms, held, err := parseDelay(h, tt.max)
			if tt.wantCode != 0 {
				var we *wire.Error
				if !errors.As(err, &we) || we.Code != tt.wantCode {
					t.Fatalf("err = %v, want code %d", err, tt.wantCode)
				}
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if ms != tt.wantMS || held != tt.wantHeld {
				t.Fatalf("got (%d, %v), want (%d, %v)", ms, held, tt.wantMS, tt.wantHeld)
			}
		})
	}
}

func TestDueAt(t *testing.T) {
	base := time.UnixMilli(1_800_000_000_000)
	tests := []struct {
		name string
		now  time.Time
		ms   int64
		want int64
	}{
		{"whole millisecond", base, 100, 1_800_000_000_100},
		{"one nanosecond past rounds up", base.Add(time.Nanosecond), 100, 1_800_000_000_101},
		{"just before the next millisecond", base.Add(999_999), 100, 1_800_000_000_101},
		{"long delay", base.Add(500 * time.Microsecond), 1 << 33, 1_800_000_000_001 + 1<<33},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DueAt(tt.now, tt.ms)
			if got != tt.want {
				t.Fatalf("DueAt = %d, want %d", got, tt.want)
			}
			if due := time.UnixMilli(got); due.Before(tt.now.Add(time.Duration(tt.ms) * time.Millisecond)) {
				t.Fatalf("due %v is before now + delay", due)
			}
		})
	}
}

// TestPublishedAt: an x-delay counts from when the message reached this
// host, when the kernel told it and it fits the proxy's clock.
func TestPublishedAt(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	tests := []struct {
		name     string
		received time.Time
		want     time.Time
	}{
		{"unknown", time.Time{}, now},
		{"waited 20ms", now.Add(-20 * time.Millisecond), now.Add(-20 * time.Millisecond)},
		{"received now", now, now},
		{"received after now (a clock held back)", now.Add(time.Millisecond), now},
		{"waited maxSocketWait", now.Add(-maxSocketWait), now.Add(-maxSocketWait)},
		{"waited longer (a clock set ahead)", now.Add(-maxSocketWait - time.Millisecond), now},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := publishedAt(now, tt.received); !got.Equal(tt.want) {
				t.Fatalf("counts from %v, want %v", got, tt.want)
			}
		})
	}
}
