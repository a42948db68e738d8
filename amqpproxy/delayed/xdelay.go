package delayed

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

// headerDelay is the header that asks for a delay, in milliseconds.
const headerDelay = "x-delay"

// Errors of parseDelay, matched with errors.Is. Each also unwraps to a
// *wire.Error with 406 PRECONDITION_FAILED and a text naming the header.
var (
	// errInvalidDelay: x-delay is not a number.
	errInvalidDelay = errors.New("x-delay is not a number")
	// errDelayTooLong: x-delay is above the configured maximum.
	errDelayTooLong = errors.New("x-delay is above the maximum delay")
)

// delayError is an errInvalidDelay or errDelayTooLong with its reply.
type delayError struct {
	kind  error
	reply *wire.Error
}

func (e *delayError) Error() string   { return e.reply.Text }
func (e *delayError) Unwrap() []error { return []error{e.kind, e.reply} }

func newDelayError(kind error, text string) error {
	return &delayError{kind: kind, reply: wire.NewError(wire.PreconditionFailed, text)}
}

// parseDelay reads x-delay from a message's headers the way RabbitMQ's
// delayed-message plugin does, and applies the proxy's maximum.
//
// It returns the delay in milliseconds and whether the message is to be held:
// a missing header, zero or a negative delay mean "route at once" (held =
// false, err = nil). Integers of any width, numeric strings and floats or
// decimals (truncated towards zero) are accepted. A value that is not a
// number, or a delay above max, is a 406 PRECONDITION_FAILED naming the
// header. Unlike the plugin, delays above 2^32-1 ms are held, not routed at
// once.
func parseDelay(headers wire.Table, max time.Duration) (ms int64, held bool, err error) {
	v, ok, err := headers.Get(headerDelay)
	if err != nil {
		return 0, false, err // the codec's 501, as RabbitMQ answers a bad table
	}
	if !ok {
		return 0, false, nil
	}
	ms, err = delayValue(v)
	if err != nil {
		return 0, false, err
	}
	if ms <= 0 {
		return 0, false, nil
	}
	if max > 0 && ms > max.Milliseconds() {
		return 0, false, newDelayError(errDelayTooLong,
			fmt.Sprintf("x-delay %d ms is larger than the maximum delay %d ms", ms, max.Milliseconds()))
	}
	return ms, true, nil
}

// delayValue converts one x-delay value to milliseconds.
func delayValue(v any) (int64, error) {
	switch v := v.(type) {
	case int8:
		return int64(v), nil
	case uint8:
		return int64(v), nil
	case int16:
		return int64(v), nil
	case uint16:
		return int64(v), nil
	case int32:
		return int64(v), nil
	case uint32:
		return int64(v), nil
	case int64:
		return v, nil
	case float32:
		return floatDelay(float64(v), v)
	case float64:
		return floatDelay(v, v)
	case wire.Decimal:
		return floatDelay(float64(v.Value)/math.Pow10(int(v.Scale)), v)
	case string:
		return stringDelay(v)
	case []byte:
		return stringDelay(string(v))
	}
	return 0, notANumber(v)
}

func stringDelay(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		return n, nil
	}
	if f, err := strconv.ParseFloat(t, 64); err == nil {
		return floatDelay(f, s)
	}
	return 0, notANumber(s)
}

func floatDelay(f float64, orig any) (int64, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f >= math.MaxInt64 || f <= math.MinInt64 {
		return 0, notANumber(orig)
	}
	return int64(f), nil // truncates towards zero
}

func notANumber(v any) error {
	return newDelayError(errInvalidDelay,
		fmt.Sprintf("invalid x-delay header: %v (%T) is not a number of milliseconds", v, v))
}

// DueAt is the due time, in unix milliseconds, of a message published at now
// with a delay of ms milliseconds. now is rounded up to the next whole
// millisecond, so that releasing at the due time is never early: truncating
// would release up to a millisecond before now + delay.
func DueAt(now time.Time, ms int64) int64 {
	ns := now.UnixNano()
	at := ns / int64(time.Millisecond)
	if ns%int64(time.Millisecond) > 0 {
		at++
	}
	return at + ms
}

// windowDue rounds a due time (unix ms) up to a multiple of window, so that
// messages published within one window with the same delay are due at the
// same millisecond and go out by priority (invariant 4); rounding up keeps
// them from going early (invariant 3). A window under 2 ms changes nothing.
func windowDue(due int64, window time.Duration) int64 {
	w := window.Milliseconds()
	if w < 2 {
		return due
	}
	if r := due % w; r != 0 {
		due += w - r
	}
	return due
}

// maxSocketWait is the longest wait in the client socket publishedAt counts
// back.
const maxSocketWait = time.Minute

// publishedAt is the instant an x-delay counts from: received, when the
// message's last bytes reached this host (the kernel's receive time on the
// wall clock; the zero time when unknown), so that a reader kept from its
// socket by a busy machine does not make messages due later than their
// publishers asked; otherwise now, when the proxy took it. A receive time
// after now, or more than maxSocketWait before it, is not used: the
// proxy's clock is then not the wall clock (tests set it apart).
func publishedAt(now, received time.Time) time.Time {
	if !received.IsZero() && !received.After(now) && now.Sub(received) <= maxSocketWait {
		return received
	}
	return now
}
