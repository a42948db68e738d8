package delayproxy

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// checkedValue wraps a flag's Value to report a bad value as
// "--name (DELAYPROXY_NAME): invalid value ...", like a bad variable.
type checkedValue struct {
	flag.Value
	name string
	err  *error
}

func (v *checkedValue) Set(s string) error {
	err := v.Value.Set(s)
	if err != nil && *v.err == nil {
		*v.err = fmt.Errorf("%s: invalid value %q: %v", settingName(v.name), s, err)
	}
	return err
}

func (v *checkedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// stringValue is a flag.Value for a string setting.
type stringValue string

func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
func (v *stringValue) String() string     { return string(*v) }

// boolValue is a flag.Value for a boolean flag (--version).
type boolValue bool

func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("not a boolean")
	}
	*v = boolValue(b)
	return nil
}
func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }

// floatValue is a flag.Value for a float setting.
type floatValue float64

func (v *floatValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return errors.New("not a number")
	}
	*v = floatValue(f)
	return nil
}
func (v *floatValue) String() string { return strconv.FormatFloat(float64(*v), 'g', -1, 64) }

// durationValue is a flag.Value for a duration: Go syntax ("1h30m", "250ms")
// or a number of days or years ("30d", "10y", a year being 365 days).
type durationValue time.Duration

func (v *durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v = durationValue(d)
	return nil
}
func (v *durationValue) String() string { return formatDuration(time.Duration(*v)) }

func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n := len(s); n > 1 && (s[n-1] == 'd' || s[n-1] == 'y') {
		f, err := strconv.ParseFloat(s[:n-1], 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, errors.New("not a duration (examples: 250ms, 90s, 1h30m, 30d, 10y)")
		}
		unit := day
		if s[n-1] == 'y' {
			unit = year
		}
		if math.Abs(f) > float64(math.MaxInt64)/float64(unit) {
			return 0, errors.New("duration out of range (at most about 292y)")
		}
		return time.Duration(f * float64(unit)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("not a duration (examples: 250ms, 90s, 1h30m, 30d, 10y)")
	}
	return d, nil
}

// formatDuration prints whole years or days as "10y" or "30d".
func formatDuration(d time.Duration) string {
	switch {
	case d != 0 && d%year == 0:
		return strconv.FormatInt(int64(d/year), 10) + "y"
	case d != 0 && d%day == 0:
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String() // "1m0s" -> "1m", "2h0m0s" -> "2h"
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// sizeValue is a flag.Value for a byte size: "134217728", "128MiB", "100MB".
type sizeValue int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

func (v *sizeValue) Set(s string) error {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > math.MaxInt64/mult || n < math.MinInt64/mult {
		return errors.New("not a size (examples: 134217728, 128MiB, 100MB)")
	}
	*v = sizeValue(n * mult)
	return nil
}
func (v *sizeValue) String() string { return formatSize(int64(*v)) }

// formatSize prints whole KiB, MiB or GiB with their unit.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
