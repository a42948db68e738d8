package delayproxy

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestLoadConfigReleaseWindow: --release-window (DELAYPROXY_RELEASE_WINDOW)
// takes 0 or whole milliseconds up to an hour; anything else stops start-up
// with one line naming the setting.
func TestLoadConfigReleaseWindow(t *testing.T) {
	if d := DefaultConfig().ReleaseWindow; d != 0 {
		t.Errorf("default release window = %v, want 0 (exact milliseconds)", d)
	}
	valid := []struct {
		args []string
		env  map[string]string
		want time.Duration
	}{
		{nil, nil, 0},
		{[]string{"--release-window", "0"}, nil, 0},
		{[]string{"--release-window", "10ms"}, nil, 10 * time.Millisecond},
		{[]string{"--release-window=1s"}, nil, time.Second},
		{[]string{"--release-window", "1h"}, nil, time.Hour},
		{nil, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "250ms"}, 250 * time.Millisecond},
		{[]string{"--release-window", "5ms"}, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "nonsense"}, 5 * time.Millisecond},
	}
	for _, tt := range valid {
		c, err := LoadConfig(tt.args, env(tt.env), &bytes.Buffer{})
		if err != nil {
			t.Errorf("%v %v: %v", tt.args, tt.env, err)
			continue
		}
		if c.ReleaseWindow != tt.want {
			t.Errorf("%v %v: release window %v, want %v", tt.args, tt.env, c.ReleaseWindow, tt.want)
		}
	}
	invalid := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--release-window", "-10ms"}, nil, "--release-window"},
		{[]string{"--release-window", "1500us"}, nil, "--release-window"},
		{[]string{"--release-window", "61m"}, nil, "--release-window"},
		{[]string{"--release-window", "2d"}, nil, "--release-window"},
		{[]string{"--release-window", "soon"}, nil, "--release-window"},
		{nil, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "-1s"}, "DELAYPROXY_RELEASE_WINDOW"},
		{nil, map[string]string{"DELAYPROXY_RELEASE_WINDOW": "soon"}, "DELAYPROXY_RELEASE_WINDOW"},
	}
	for _, tt := range invalid {
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
