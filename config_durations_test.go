package delayproxy

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// durationSetting is a table of values for one duration setting: the ones
// LoadConfig takes (args and env, the value it must yield) and the ones it
// refuses (with one line naming want, the flag or variable).
type durationSetting struct {
	get     func(Config) time.Duration
	valid   []takenDuration
	invalid []refusedDuration
}

// takenDuration is a setting LoadConfig takes: from args and env, want.
type takenDuration struct {
	args []string
	env  map[string]string
	want time.Duration
}

// refusedDuration is a setting LoadConfig refuses, in one line naming want.
type refusedDuration struct {
	args []string
	env  map[string]string
	want string
}

func (s durationSetting) check(t *testing.T) {
	t.Helper()
	for _, tt := range s.valid {
		c, err := LoadConfig(tt.args, env(tt.env), &bytes.Buffer{})
		if err != nil {
			t.Errorf("%v %v: %v", tt.args, tt.env, err)
			continue
		}
		if got := s.get(c); got != tt.want {
			t.Errorf("%v %v: %v, want %v", tt.args, tt.env, got, tt.want)
		}
	}
	for _, tt := range s.invalid {
		_, err := LoadConfig(tt.args, env(tt.env), &bytes.Buffer{})
		if err == nil {
			t.Errorf("%v %v: accepted", tt.args, tt.env)
			continue
		}
		t.Log(err)
		if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v %v: error %q is not one line naming %s", tt.args, tt.env, err, tt.want)
		}
	}
}

// TestLoadConfigReleaseWindow: --release-window (DELAYPROXY_RELEASE_WINDOW)
// takes 0 or whole milliseconds up to an hour; anything else stops start-up
// with one line naming the setting.
func TestLoadConfigReleaseWindow(t *testing.T) {
	if d := DefaultConfig().ReleaseWindow; d != 0 {
		t.Errorf("default release window = %v, want 0 (exact milliseconds)", d)
	}
	durationSetting{
		get: func(c Config) time.Duration { return c.ReleaseWindow },
		valid: []takenDuration{
			{nil, nil, 0},
			{[]string{"--release-window", "0"}, nil, 0},
			{[]string{"--release-window", "10ms"}, nil, 10 * time.Millisecond},
			{[]string{"--release-window=1s"}, nil, time.Second},
			{[]string{"--release-window", "1h"}, nil, time.Hour},
			{nil, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "250ms"}, 250 * time.Millisecond},
			{[]string{"--release-window", "5ms"}, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "nonsense"}, 5 * time.Millisecond},
		},
		invalid: []refusedDuration{
			{[]string{"--release-window", "-10ms"}, nil, "--release-window"},
			{[]string{"--release-window", "1500us"}, nil, "--release-window"},
			{[]string{"--release-window", "61m"}, nil, "--release-window"},
			{[]string{"--release-window", "2d"}, nil, "--release-window"},
			{[]string{"--release-window", "soon"}, nil, "--release-window"},
			{nil, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "-1s"}, "DELAYPROXY_RELEASE_WINDOW"},
			{nil, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "soon"}, "DELAYPROXY_RELEASE_WINDOW"},
		},
	}.check(t)
}

// TestLoadConfigReleasesFirst: --releases-first (DELAYPROXY_RELEASES_FIRST)
// is 1 ms by default, takes 0 (off) or a duration up to a minute, and
// refuses anything else with one line naming the setting.
func TestLoadConfigReleasesFirst(t *testing.T) {
	if d := DefaultConfig().ReleasesFirst; d != time.Millisecond {
		t.Errorf("default releases-first = %v, want 1ms", d)
	}
	durationSetting{
		get: func(c Config) time.Duration { return c.ReleasesFirst },
		valid: []takenDuration{
			{nil, nil, time.Millisecond},
			{[]string{"--releases-first", "0"}, nil, 0},
			{[]string{"--releases-first", "2500us"}, nil, 2500 * time.Microsecond},
			{[]string{"--releases-first=1m"}, nil, time.Minute},
			{nil, map[string]string{"DELAYPROXY_RELEASES_FIRST": "20ms"}, 20 * time.Millisecond},
		},
		invalid: []refusedDuration{
			{[]string{"--releases-first", "-1ms"}, nil, "--releases-first"},
			{[]string{"--releases-first", "61s"}, nil, "--releases-first"},
			{[]string{"--releases-first", "now"}, nil, "--releases-first"},
			{nil, map[string]string{"DELAYPROXY_RELEASES_FIRST": "-5ms"}, "DELAYPROXY_RELEASES_FIRST"},
		},
	}.check(t)
}
