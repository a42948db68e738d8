package delayproxy

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/testcert"
)

// env returns a getenv over a map.
func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadConfigDefaults(t *testing.T) {
	got, err := LoadConfig(nil, env(nil), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("LoadConfig() = %+v\nwant %+v", got, want)
	}
	if got.MaxMessageSize != 134217728 {
		t.Errorf("default max message size = %d, want RabbitMQ 3.10's 134217728", got.MaxMessageSize)
	}
	if got.ReleaseAccountURL() != got.UpstreamURL {
		t.Errorf("release account = %q, want the upstream URL", got.ReleaseAccountURL())
	}
}

func TestLoadConfigPrecedence(t *testing.T) {
	e := env(map[string]string{
		"DELAYPROXY_LISTEN":            "127.0.0.1:6000",
		"DELAYPROXY_UPSTREAM":          "amqps://u:p@rabbit:5671/",
		"DELAYPROXY_RELEASE_URL":       "amqp://rel:pw@rabbit/",
		"DELAYPROXY_MAX_DELAY":         "30d",
		"DELAYPROXY_RELEASE_RATE":      "500",
		"DELAYPROXY_MAX_MESSAGE_SIZE":  "16MiB",
		"DELAYPROXY_HEARTBEAT":         "30s",
		"DELAYPROXY_LOG_FORMAT":        "json",
		"DELAYPROXY_HTTP_ADDR":         "0.0.0.0:15673",
		"DELAYPROXY_ADMIN_TOKEN":       "0123456789abcdef-env",
		"DELAYPROXY_HANDSHAKE_TIMEOUT": "soon",
	})
	args := []string{"--listen", ":7000", "-max-delay=1y", "--log-level", "debug", "--data-dir", t.TempDir(), "--handshake-timeout=5s"}
	c, err := LoadConfig(args, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"flag beats env", c.ListenAddr, ":7000"},
		{"flag beats env (duration)", c.MaxDelay, 365 * 24 * time.Hour},
		{"env beats default", c.UpstreamURL, "amqps://u:p@rabbit:5671/"},
		{"release url from env", c.ReleaseAccountURL(), "amqp://rel:pw@rabbit/"},
		{"rate", c.ReleaseRate, 500.0},
		{"size", c.MaxMessageSize, int64(16 << 20)},
		{"heartbeat", c.Heartbeat, 30 * time.Second},
		{"format", c.LogFormat, "json"},
		{"level from flag", c.LogLevel, "debug"},
		{"token", c.AdminToken, "0123456789abcdef-env"},
		{"default kept", c.ShutdownGrace, 30 * time.Second},
		{"flag overrides a bad variable", c.HandshakeTimeout, 5 * time.Second},
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s: got %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestLoadConfigInvalid(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := testcert.New(t).Write(t, dir)
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // must appear in the error: the flag or variable named
	}{
		{"listen no port", []string{"--listen", "localhost"}, nil, "--listen"},
		{"listen bad port", []string{"--listen", ":99999"}, nil, "--listen"},
		{"listen env", nil, map[string]string{"DELAYPROXY_LISTEN": "nope"}, "DELAYPROXY_LISTEN"},
		{"cert without key", []string{"--tls-cert", certFile}, nil, "--tls-key"},
		{"key without cert", []string{"--tls-key", keyFile}, nil, "--tls-cert"},
		{"cert missing", []string{"--tls-cert", filepath.Join(dir, "nope.pem"), "--tls-key", keyFile}, nil, "--tls-cert"},
		{"cert garbage", []string{"--tls-cert", file, "--tls-key", file}, nil, "--tls-cert"},
		{"upstream scheme", []string{"--upstream", "http://localhost/"}, nil, "--upstream"},
		{"upstream garbage", []string{"--upstream", "::"}, nil, "--upstream"},
		{"upstream bad escape hides password", []string{"--upstream", "amqp://u:hunter2@host%zz/"}, nil, "--upstream"},
		{"upstream env", nil, map[string]string{"DELAYPROXY_UPSTREAM": "redis://x"}, "DELAYPROXY_UPSTREAM"},
		{"release url", []string{"--release-url", "ftp://x"}, nil, "--release-url"},
		{"store not postgres", []string{"--store", "mysql://u:hunter2@db/x"}, nil, "--store"},
		{"store bad escape hides password", []string{"--store", "postgres://u:hunter2@host%zz/db"}, nil, "--store"},
		{"store a path", nil, map[string]string{"DELAYPROXY_STORE": "/var/lib/delayproxy"}, "DELAYPROXY_STORE"},
		{"store schema quoted", []string{"--store-schema", `"Mixed"`}, nil, "--store-schema"},
		{"store schema starts with a digit", nil, map[string]string{"DELAYPROXY_STORE_SCHEMA": "1cluster"}, "DELAYPROXY_STORE_SCHEMA"},
		{"data dir is a file", []string{"--data-dir", file}, nil, "--data-dir"},
		{"data dir empty", []string{"--data-dir", ""}, nil, "--data-dir"},
		{"http addr", []string{"--http-addr", "15673"}, nil, "--http-addr"},
		{"public http without token", []string{"--http-addr", "0.0.0.0:15673"}, nil, "--admin-token"},
		{"all interfaces without token", []string{"--http-addr", ":15673"}, nil, "--admin-token"},
		{"named host without token", []string{"--http-addr", "example.com:15673"}, nil, "--admin-token"},
		{"short token", []string{"--admin-token", "short"}, nil, "--admin-token"},
		{"token with space", []string{"--admin-token", "0123456789 abcdef"}, nil, "--admin-token"},
		{"token and token file", []string{"--admin-token", "0123456789abcdef", "--admin-token-file", file}, nil, "--admin-token-file"},
		{"token file missing", []string{"--admin-token-file", filepath.Join(dir, "nope")}, nil, "--admin-token-file"},
		{"release rate negative", []string{"--release-rate", "-1"}, nil, "--release-rate"},
		{"release rate NaN", []string{"--release-rate", "NaN"}, nil, "--release-rate"},
		{"release rate word", []string{"--release-rate", "fast"}, nil, "--release-rate"},
		{"release rate env", nil, map[string]string{"DELAYPROXY_RELEASE_RATE": "fast"}, "DELAYPROXY_RELEASE_RATE"},
		{"max delay zero", []string{"--max-delay", "0"}, nil, "--max-delay"},
		{"released delay type", []string{"--released-delay-type", "int16"}, nil, "--released-delay-type"},
		{"max delay word", []string{"--max-delay", "forever"}, nil, "--max-delay"},
		{"max delay huge", []string{"--max-delay", "1000y"}, nil, "--max-delay"},
		{"max delay env", nil, map[string]string{"DELAYPROXY_MAX_DELAY": "-5s"}, "DELAYPROXY_MAX_DELAY"},
		{"size zero", []string{"--max-message-size", "0"}, nil, "--max-message-size"},
		{"size above RabbitMQ's limit", []string{"--max-message-size", "513MiB"}, nil, "--max-message-size"},
		{"size word", []string{"--max-message-size", "big"}, nil, "--max-message-size"},
		{"size overflow", []string{"--max-message-size", "99999999999999GiB"}, nil, "--max-message-size"},
		{"handshake zero", []string{"--handshake-timeout", "0s"}, nil, "--handshake-timeout"},
		{"heartbeat fraction", []string{"--heartbeat", "1500ms"}, nil, "--heartbeat"},
		{"heartbeat too big", []string{"--heartbeat", "20h"}, nil, "--heartbeat"},
		{"heartbeat negative", []string{"--heartbeat", "-1s"}, nil, "--heartbeat"},
		{"grace negative", []string{"--shutdown-grace", "-1s"}, nil, "--shutdown-grace"},
		{"log level", []string{"--log-level", "verbose"}, nil, "--log-level"},
		{"log level env", nil, map[string]string{"DELAYPROXY_LOG_LEVEL": "trace"}, "DELAYPROXY_LOG_LEVEL"},
		{"log format", []string{"--log-format", "xml"}, nil, "--log-format"},
		{"unknown flag", []string{"--listen-addr", ":1"}, nil, "listen-addr"},
		{"stray argument", []string{"serve"}, nil, `"serve"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadConfig(tt.args, env(tt.env), &bytes.Buffer{})
			if err == nil {
				t.Fatal("LoadConfig accepted it")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password: %q", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestLoadConfigValid(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := testcert.New(t).Write(t, dir)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("  s3cret-s3cret-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		check func(Config) bool
	}{
		{"tls pair", []string{"--tls-cert", certFile, "--tls-key", keyFile}, func(c Config) bool {
			return c.TLSCert == certFile && c.TLSKey == keyFile
		}},
		{"no tls", nil, func(c Config) bool { return c.TLSCert == "" && c.TLSKey == "" }},
		{"token file trimmed, public address", []string{"--admin-token-file", tokenFile, "--http-addr", "0.0.0.0:1"},
			func(c Config) bool { return c.AdminToken == "s3cret-s3cret-s3cret" }},
		{"localhost needs no token", []string{"--http-addr", "localhost:1"}, func(c Config) bool { return c.AdminToken == "" }},
		{"ipv6 loopback needs no token", []string{"--http-addr", "[::1]:1"}, func(c Config) bool { return true }},
		{"127.0.0.2 is loopback", []string{"--http-addr", "127.0.0.2:1"}, func(c Config) bool { return true }},
		{"days", []string{"--max-delay", "1.5d"}, func(c Config) bool { return c.MaxDelay == 36*time.Hour }},
		{"released delay int32", []string{"--released-delay-type", "int32"}, func(c Config) bool { return c.ReleasedDelayType == "int32" }},
		{"released delay default", nil, func(c Config) bool { return c.ReleasedDelayType == "int64" }},
		{"go duration", []string{"--max-delay", "90m"}, func(c Config) bool { return c.MaxDelay == 90*time.Minute }},
		{"decimal size", []string{"--max-message-size", "100MB"}, func(c Config) bool { return c.MaxMessageSize == 100_000_000 }},
		{"plain size", []string{"--max-message-size", "4096"}, func(c Config) bool { return c.MaxMessageSize == 4096 }},
		{"heartbeat off", []string{"--heartbeat", "0"}, func(c Config) bool { return c.Heartbeat == 0 }},
		{"amqps upstream", []string{"--upstream", "amqps://rabbit.internal/"}, func(c Config) bool { return true }},
		{"bbolt store by default", nil, func(c Config) bool { return c.Store == "" && c.StoreSchema == "delayproxy" }},
		{"postgres store, several hosts", []string{"--store", "postgres://dp:pw@pg1:5432,pg2:5432/dp?target_session_attrs=read-write"},
			func(c Config) bool { return strings.HasPrefix(c.Store, "postgres://") }},
		{"postgresql scheme, own schema", []string{"--store", "postgresql://pg/dp", "--store-schema", "cluster_b"},
			func(c Config) bool { return c.StoreSchema == "cluster_b" }},
		{"release rate fraction", []string{"--release-rate", "0.5"}, func(c Config) bool { return c.ReleaseRate == 0.5 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := LoadConfig(tt.args, env(nil), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestHelpNamesEveryFlag(t *testing.T) {
	var out bytes.Buffer
	_, err := LoadConfig([]string{"--help"}, env(nil), &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	help := out.String()
	c := DefaultConfig()
	var tf string
	var v bool
	for _, o := range c.options(&tf, &v) {
		if !strings.Contains(help, "--"+o.name) {
			t.Errorf("help lacks --%s", o.name)
		}
		if o.env && !strings.Contains(help, envName(o.name)) {
			t.Errorf("help lacks %s", envName(o.name))
		}
	}
	for _, want := range []string{`default ":5673"`, `default "10y"`, `default "128MiB"`, `default "127.0.0.1:15673"`, "healthcheck", "version"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %s:\n%s", want, help)
		}
	}
}

func TestVersion(t *testing.T) {
	if _, err := LoadConfig([]string{"--version"}, env(nil), &bytes.Buffer{}); !errors.Is(err, ErrVersion) {
		t.Fatalf("err = %v, want ErrVersion", err)
	}
	if v := VersionString(); !strings.HasPrefix(v, "delayproxy ") || !strings.Contains(v, "go1.") {
		t.Errorf("VersionString() = %q", v)
	}
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v9.8.7"
	if v := VersionString(); !strings.HasPrefix(v, "delayproxy v9.8.7 (") {
		t.Errorf("VersionString() = %q", v)
	}
}

func TestLogValueRedacts(t *testing.T) {
	c := DefaultConfig()
	c.UpstreamURL = "amqp://user:hunter2@rabbit:5672/"
	c.AdminToken = "supersecret-token-value"
	var out bytes.Buffer
	slog.New(slog.NewTextHandler(&out, nil)).Info("config", "config", c)
	s := out.String()
	for _, secret := range []string{"hunter2", "supersecret"} {
		if strings.Contains(s, secret) {
			t.Errorf("log shows %q: %s", secret, s)
		}
	}
	if !strings.Contains(s, "rabbit:5672") {
		t.Errorf("log lacks the upstream host: %s", s)
	}
}

func TestNewLogger(t *testing.T) {
	c := DefaultConfig()
	c.LogFormat, c.LogLevel = "json", "warn"
	var out bytes.Buffer
	log := c.NewLogger(&out)
	log.Info("hidden")
	log.Warn("shown")
	if s := out.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"msg":"shown"`) {
		t.Errorf("json logger at warn wrote %q", s)
	}
}

func TestEnsureDataDir(t *testing.T) {
	c := DefaultConfig()
	c.DataDir = filepath.Join(t.TempDir(), "a", "b")
	p, err := c.EnsureDataDir()
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(c.DataDir, "delayproxy.db") {
		t.Errorf("store path = %q", p)
	}
	if fi, err := os.Stat(c.DataDir); err != nil || !fi.IsDir() {
		t.Errorf("data dir not created: %v", err)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{10 * year, 30 * day, 90 * time.Second, 1500 * time.Millisecond, time.Minute, 2 * time.Hour, 0} {
		var v durationValue
		if err := v.Set(formatDuration(d)); err != nil || time.Duration(v) != d {
			t.Errorf("duration %v -> %q -> %v, %v", d, formatDuration(d), time.Duration(v), err)
		}
	}
	for _, n := range []int64{134217728, 1 << 30, 4096, 1000} {
		var v sizeValue
		if err := v.Set(formatSize(n)); err != nil || int64(v) != n {
			t.Errorf("size %d -> %q -> %d, %v", n, formatSize(n), int64(v), err)
		}
	}
}

// TestDeliveryTimeHeadersSetting: --delivery-time-headers is on by
// default and set by flag or DELAYPROXY_DELIVERY_TIME_HEADERS, the flag
// first; a value that is not a boolean is refused, named.
func TestDeliveryTimeHeadersSetting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    bool
		wantErr string
	}{
		{name: "default", want: true},
		{name: "flag off", args: []string{"--delivery-time-headers=false"}, want: false},
		{name: "env off", env: map[string]string{"DELAYPROXY_DELIVERY_TIME_HEADERS": "false"}, want: false},
		{name: "env 0", env: map[string]string{"DELAYPROXY_DELIVERY_TIME_HEADERS": "0"}, want: false},
		{name: "flag beats env", args: []string{"--delivery-time-headers=true"}, env: map[string]string{"DELAYPROXY_DELIVERY_TIME_HEADERS": "false"}, want: true},
		{name: "bare flag", args: []string{"--delivery-time-headers"}, env: map[string]string{"DELAYPROXY_DELIVERY_TIME_HEADERS": "false"}, want: true},
		{name: "bad env", env: map[string]string{"DELAYPROXY_DELIVERY_TIME_HEADERS": "maybe"}, wantErr: "delivery-time-headers"},
		{name: "bad flag", args: []string{"--delivery-time-headers=maybe"}, wantErr: "delivery-time-headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(tc.args, env(tc.env), &bytes.Buffer{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("LoadConfig = %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.DeliveryTimeHeaders != tc.want {
				t.Fatalf("DeliveryTimeHeaders = %v (%v), want %v", c.DeliveryTimeHeaders, err, tc.want)
			}
		})
	}
}
