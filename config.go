package delayproxy

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy/admin"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors returned by LoadConfig that are not failures.
var (
	// ErrHelp: --help was given; the usage has been written to stderr.
	ErrHelp = flag.ErrHelp
	// ErrVersion: --version was given; print VersionString and exit 0.
	ErrVersion = errors.New("version requested")
)

// Version is the release version, set at build time with
//
//	-ldflags "-X github.com/delayproxy/delayproxy.Version=v1.2.3"
//
// When it is empty, VersionString falls back to the build information.
var Version string

// Limits and defaults that follow RabbitMQ 3.10's own.
const (
	// DefaultMaxMessageSize is RabbitMQ 3.10's max_message_size (128 MiB).
	DefaultMaxMessageSize = 128 << 20
	// MaxMessageSizeLimit is RabbitMQ's hard ceiling for max_message_size
	// (512 MiB).
	MaxMessageSizeLimit = 512 << 20
	// StoreFile is the name of the bbolt file inside Config.DataDir.
	StoreFile = "delayproxy.db"
	// minTokenLen is the shortest admin token accepted.
	minTokenLen = 16
)

const (
	day  = 24 * time.Hour
	year = 365 * day
)

// Config is everything an operator can set. Start from DefaultConfig; fields
// left at their zero value are not replaced by defaults.
type Config struct {
	// ListenAddr is the AMQP address clients connect to.
	ListenAddr string
	// TLSCert and TLSKey are PEM files; with both set clients connect with
	// TLS (amqps). Both or neither.
	TLSCert, TLSKey string
	// UpstreamURL is RabbitMQ, amqp:// or amqps://. Client connections go to
	// its host and port with the client's own credentials and vhost; its
	// user and password serve only as the release account when ReleaseURL
	// is empty.
	UpstreamURL string
	// ReleaseURL is the RabbitMQ account that publishes due messages; ""
	// means UpstreamURL. Its vhost is ignored (one connection per vhost), so
	// it needs write permission on every vhost with delayed exchanges.
	ReleaseURL string
	// DataDir holds the store file; created if missing.
	DataDir string
	// HTTPAddr serves /metrics, /healthz, /readyz and the admin API.
	HTTPAddr string
	// AdminToken is the bearer token of the admin API; required when
	// HTTPAddr is not a loopback address.
	AdminToken string
	// ReleaseRate caps releases per second; 0 means unlimited.
	ReleaseRate float64
	// MaxDelay is the largest x-delay accepted; larger ones are refused
	// with 406 PRECONDITION_FAILED.
	MaxDelay time.Duration
	// MaxMessageSize is the largest message body accepted, in bytes.
	MaxMessageSize int64
	// HandshakeTimeout bounds a client's AMQP handshake.
	HandshakeTimeout time.Duration
	// Heartbeat is the heartbeat interval the proxy proposes to clients in
	// connection.tune, instead of RabbitMQ's; 0 proposes none. The client's
	// tune-ok goes to RabbitMQ too, so both hops use the same. Whole seconds.
	Heartbeat time.Duration
	// ShutdownGrace is how long shutdown waits for in-flight work.
	ShutdownGrace time.Duration
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogFormat is text or json.
	LogFormat string
}

// DefaultConfig returns the defaults; the ones about AMQP follow RabbitMQ
// 3.10.
func DefaultConfig() Config {
	return Config{
		ListenAddr:       ":5673",
		UpstreamURL:      "amqp://guest:guest@localhost:5672/",
		DataDir:          "./data",
		HTTPAddr:         "127.0.0.1:15673",
		MaxDelay:         10 * year,
		MaxMessageSize:   DefaultMaxMessageSize,
		HandshakeTimeout: 10 * time.Second, // RabbitMQ handshake_timeout
		Heartbeat:        60 * time.Second, // RabbitMQ heartbeat
		ShutdownGrace:    30 * time.Second,
		LogLevel:         "info",
		LogFormat:        "text",
	}
}

// option is one setting: its flag, environment variable and help.
type option struct {
	name  string // flag name, without dashes
	arg   string // placeholder in the usage, "" for booleans
	usage string
	value flag.Value
	env   bool // settable by DELAYPROXY_<NAME>
}

// envName is the environment variable of a flag: DELAYPROXY_ + upper snake.
func envName(flagName string) string {
	return "DELAYPROXY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// settingName is how errors name a flag: "--max-delay (DELAYPROXY_MAX_DELAY)".
func settingName(flagName string) string {
	return "--" + flagName + " (" + envName(flagName) + ")"
}

// options binds every setting of c to its flag.
func (c *Config) options(tokenFile *string, version *bool) []option {
	return []option{
		{name: "listen", arg: "ADDR", env: true, value: (*stringValue)(&c.ListenAddr),
			usage: "AMQP address clients connect to"},
		{name: "tls-cert", arg: "FILE", env: true, value: (*stringValue)(&c.TLSCert),
			usage: "PEM certificate for AMQP over TLS (amqps); needs --tls-key"},
		{name: "tls-key", arg: "FILE", env: true, value: (*stringValue)(&c.TLSKey),
			usage: "PEM private key of --tls-cert"},
		{name: "upstream", arg: "URL", env: true, value: (*stringValue)(&c.UpstreamURL),
			usage: "RabbitMQ, amqp:// or amqps://; clients reach it with their own credentials and vhost"},
		{name: "release-url", arg: "URL", env: true, value: (*stringValue)(&c.ReleaseURL),
			usage: "RabbitMQ account that publishes due messages (vhost ignored; needs write on every vhost with delayed exchanges); default: --upstream"},
		{name: "data-dir", arg: "DIR", env: true, value: (*stringValue)(&c.DataDir),
			usage: "directory of the store file " + StoreFile + "; created if missing"},
		{name: "http-addr", arg: "ADDR", env: true, value: (*stringValue)(&c.HTTPAddr),
			usage: "HTTP address of /metrics, /healthz, /readyz and the admin API (/api/); a non-loopback address needs --admin-token"},
		{name: "admin-token", arg: "TOKEN", env: true, value: (*stringValue)(&c.AdminToken),
			usage: fmt.Sprintf("bearer token of the admin API, at least %d characters; prefer the environment or --admin-token-file to the command line", minTokenLen)},
		{name: "admin-token-file", arg: "FILE", env: true, value: (*stringValue)(tokenFile),
			usage: "file holding the admin token (e.g. a Docker secret); surrounding white space is ignored"},
		{name: "release-rate", arg: "N", env: true, value: (*floatValue)(&c.ReleaseRate),
			usage: "most messages released per second; 0 = unlimited"},
		{name: "max-delay", arg: "DURATION", env: true, value: (*durationValue)(&c.MaxDelay),
			usage: "largest x-delay accepted; above it a publish is refused with 406 (units: ms s m h d y)"},
		{name: "max-message-size", arg: "SIZE", env: true, value: (*sizeValue)(&c.MaxMessageSize),
			usage: "largest message body accepted (bytes, or KiB MiB GiB KB MB GB; at most 512MiB)"},
		{name: "handshake-timeout", arg: "DURATION", env: true, value: (*durationValue)(&c.HandshakeTimeout),
			usage: "time a client has to complete the AMQP handshake"},
		{name: "heartbeat", arg: "DURATION", env: true, value: (*durationValue)(&c.Heartbeat),
			usage: "heartbeat proposed to clients, whole seconds; 0 disables"},
		{name: "shutdown-grace", arg: "DURATION", env: true, value: (*durationValue)(&c.ShutdownGrace),
			usage: "time shutdown waits for in-flight publishes and releases"},
		{name: "log-level", arg: "LEVEL", env: true, value: (*stringValue)(&c.LogLevel),
			usage: "debug, info, warn or error"},
		{name: "log-format", arg: "FORMAT", env: true, value: (*stringValue)(&c.LogFormat),
			usage: "text or json"},
		{name: "version", value: (*boolValue)(version),
			usage: "print the version and exit"},
	}
}

// LoadConfig builds the configuration from command-line flags (args without
// the program name) and DELAYPROXY_* environment variables read through
// getenv: a flag beats the environment, which beats the default. It returns
// ErrHelp after writing the usage to stderr for --help, ErrVersion for
// --version, and otherwise the first invalid setting, named.
func LoadConfig(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	c := DefaultConfig()
	var tokenFile string
	var version bool
	opts := c.options(&tokenFile, &version)

	fs := flag.NewFlagSet("delayproxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, usage printed only for --help
	fs.Usage = func() {}
	var setErr error // the first flag value that did not parse, named our way
	for _, o := range opts {
		fs.Var(&checkedValue{Value: o.value, name: o.name, err: &setErr}, o.name, o.usage)
	}
	// The environment first, then flags over it. A bad variable is an
	// error unless a flag overrides it.
	envErr := map[string]error{}
	for _, o := range opts {
		if !o.env {
			continue
		}
		if v := getenv(envName(o.name)); v != "" {
			if err := o.value.Set(v); err != nil {
				envErr[o.name] = fmt.Errorf("%s (--%s): invalid value %q: %v", envName(o.name), o.name, v, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeUsage(stderr, opts)
			return Config{}, ErrHelp
		}
		if setErr != nil {
			return Config{}, setErr
		}
		return Config{}, err
	}
	if version {
		return Config{}, ErrVersion
	}
	fs.Visit(func(f *flag.Flag) { delete(envErr, f.Name) })
	for _, o := range opts {
		if err := envErr[o.name]; err != nil {
			return Config{}, err
		}
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (settings are flags; see --help)", fs.Arg(0))
	}
	if tokenFile != "" {
		if c.AdminToken != "" {
			return Config{}, fmt.Errorf("%s and %s are both set; use one", settingName("admin-token"), settingName("admin-token-file"))
		}
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return Config{}, fmt.Errorf("%s: %v", settingName("admin-token-file"), err)
		}
		c.AdminToken = strings.TrimSpace(string(b))
		if c.AdminToken == "" {
			return Config{}, fmt.Errorf("%s: %s is empty", settingName("admin-token-file"), tokenFile)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// writeUsage prints the help: every flag with its environment variable and
// default.
func writeUsage(w io.Writer, opts []option) {
	def := DefaultConfig()
	var defTokenFile string
	var defVersion bool
	defaults := map[string]string{}
	for _, o := range def.options(&defTokenFile, &defVersion) {
		defaults[o.name] = o.value.String()
	}
	defaults["release-url"] = "" // shown as the --upstream fallback in its usage

	fmt.Fprintf(w, `Usage:
  delayproxy [flags]               run the proxy
  delayproxy healthcheck [flags]   exit 0 if the running proxy's /healthz answers 200, else 1
  delayproxy version               print the version

delayproxy stands in front of RabbitMQ and implements x-delayed-message
exchanges with a durable on-disk store. Every flag can also be set by the
environment variable shown; a flag beats the environment, which beats the
default.

Flags:
`)
	for _, o := range opts {
		head := "  --" + o.name
		if o.arg != "" {
			head += " " + o.arg
		}
		var meta []string
		if o.env {
			meta = append(meta, "env "+envName(o.name))
		}
		if d := defaults[o.name]; d != "" && o.arg != "" {
			meta = append(meta, "default "+strconv.Quote(d))
		}
		line := o.usage
		if len(meta) > 0 {
			line += " [" + strings.Join(meta, ", ") + "]"
		}
		fmt.Fprintf(w, "%s\n      %s\n", head, line)
	}
}

// Validate checks every setting and returns the first problem as one line
// naming the flag and its environment variable. It reads the TLS files but
// creates nothing.
func (c Config) Validate() error {
	bad := func(name, format string, args ...any) error {
		return fmt.Errorf("%s: %s", settingName(name), fmt.Sprintf(format, args...))
	}
	if err := checkHostPort(c.ListenAddr); err != nil {
		return bad("listen", "%v", err)
	}
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		return bad("tls-key", "missing: --tls-cert is set, a key is needed too")
	case c.TLSCert == "" && c.TLSKey != "":
		return bad("tls-cert", "missing: --tls-key is set, a certificate is needed too")
	case c.TLSCert != "":
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			return bad("tls-cert", "cannot load the certificate and key: %v", err)
		}
	}
	if err := checkAMQPURL(c.UpstreamURL); err != nil {
		return bad("upstream", "%v", err)
	}
	if c.ReleaseURL != "" {
		if err := checkAMQPURL(c.ReleaseURL); err != nil {
			return bad("release-url", "%v", err)
		}
	}
	if c.DataDir == "" {
		return bad("data-dir", "must not be empty")
	}
	if fi, err := os.Stat(c.DataDir); err == nil && !fi.IsDir() {
		return bad("data-dir", "%s exists and is not a directory", c.DataDir)
	}
	if err := checkHostPort(c.HTTPAddr); err != nil {
		return bad("http-addr", "%v", err)
	}
	if c.AdminToken == "" && !admin.IsLoopback(c.HTTPAddr) {
		return bad("admin-token", "required because --http-addr %s is not a loopback address (anyone who can reach it could cancel messages); set one of at least %d characters, e.g. from `openssl rand -hex 32`", c.HTTPAddr, minTokenLen)
	}
	if c.AdminToken != "" && len(c.AdminToken) < minTokenLen {
		return bad("admin-token", "too short: %d characters, want at least %d", len(c.AdminToken), minTokenLen)
	}
	if strings.ContainsAny(c.AdminToken, " \t\r\n") {
		return bad("admin-token", "must not contain white space")
	}
	if c.ReleaseRate < 0 || math.IsNaN(c.ReleaseRate) || math.IsInf(c.ReleaseRate, 0) {
		return bad("release-rate", "must be a finite number >= 0, got %v", c.ReleaseRate)
	}
	if c.MaxDelay <= 0 {
		return bad("max-delay", "must be > 0, got %s", formatDuration(c.MaxDelay))
	}
	if c.MaxMessageSize <= 0 || c.MaxMessageSize > MaxMessageSizeLimit {
		return bad("max-message-size", "must be between 1 and %s (RabbitMQ's own limit), got %d", formatSize(MaxMessageSizeLimit), c.MaxMessageSize)
	}
	if c.HandshakeTimeout <= 0 {
		return bad("handshake-timeout", "must be > 0, got %s", formatDuration(c.HandshakeTimeout))
	}
	if c.Heartbeat < 0 || c.Heartbeat > math.MaxUint16*time.Second || c.Heartbeat%time.Second != 0 {
		return bad("heartbeat", "must be whole seconds from 0 to 65535s, got %s", formatDuration(c.Heartbeat))
	}
	if c.ShutdownGrace < 0 {
		return bad("shutdown-grace", "must be >= 0, got %s", formatDuration(c.ShutdownGrace))
	}
	if _, ok := logLevels[c.LogLevel]; !ok {
		return bad("log-level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return bad("log-format", "%q is not one of text, json", c.LogFormat)
	}
	return nil
}

var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// checkHostPort accepts host:port with a numeric port (0 picks a free one).
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

// checkAMQPURL accepts what the releaser and the dialler will: amqp:// or
// amqps:// with a host.
func checkAMQPURL(s string) error {
	u, err := amqp.ParseURI(s)
	if err != nil {
		// url.Error repeats the URL, password included: keep only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			return fmt.Errorf("not a valid URL: %v", ue.Err)
		}
		return fmt.Errorf("%s: %v", redactURL(s), err)
	}
	if u.Host == "" {
		return fmt.Errorf("%s: no host", redactURL(s))
	}
	return nil
}

// ReleaseAccountURL is the URL the releaser connects with: ReleaseURL, or
// UpstreamURL when that is empty.
func (c Config) ReleaseAccountURL() string {
	if c.ReleaseURL != "" {
		return c.ReleaseURL
	}
	return c.UpstreamURL
}

// StorePath is the path of the store file inside DataDir.
func (c Config) StorePath() string { return filepath.Join(c.DataDir, StoreFile) }

// EnsureDataDir creates DataDir (mode 0750) if it is missing and returns
// StorePath.
func (c Config) EnsureDataDir() (string, error) {
	if err := os.MkdirAll(c.DataDir, 0o750); err != nil {
		return "", fmt.Errorf("%s: %v", settingName("data-dir"), err)
	}
	return c.StorePath(), nil
}

// TLSConfig is the server TLS configuration for client connections, or nil
// when TLS is not configured.
func (c Config) TLSConfig() (*tls.Config, error) {
	if c.TLSCert == "" && c.TLSKey == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", settingName("tls-cert"), err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// NewLogger returns the slog logger the settings ask for, writing to w.
func (c Config) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: logLevels[c.LogLevel]}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// LogValue shows the settings with passwords and the token redacted.
func (c Config) LogValue() slog.Value {
	token := ""
	if c.AdminToken != "" {
		token = "REDACTED"
	}
	return slog.GroupValue(
		slog.String("listen", c.ListenAddr),
		slog.Bool("tls", c.TLSCert != ""),
		slog.String("upstream", redactURL(c.UpstreamURL)),
		slog.String("release_url", redactURL(c.ReleaseAccountURL())),
		slog.String("data_dir", c.DataDir),
		slog.String("http_addr", c.HTTPAddr),
		slog.String("admin_token", token),
		slog.Float64("release_rate", c.ReleaseRate),
		slog.String("max_delay", formatDuration(c.MaxDelay)),
		slog.String("max_message_size", formatSize(c.MaxMessageSize)),
		slog.String("handshake_timeout", formatDuration(c.HandshakeTimeout)),
		slog.String("heartbeat", formatDuration(c.Heartbeat)),
		slog.String("shutdown_grace", formatDuration(c.ShutdownGrace)),
		slog.String("log_level", c.LogLevel),
		slog.String("log_format", c.LogFormat),
	)
}

// redactURL hides the password of an AMQP URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// VersionString is "delayproxy <version> (<go version> <os>/<arch>)", the
// version being Version or, when that is empty, the module version and VCS
// revision from the build information.
func VersionString() string {
	v := Version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok {
			if bi.Main.Version != "" {
				v = bi.Main.Version
			}
			var rev, dirty string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					if s.Value == "true" {
						dirty = "-dirty"
					}
				}
			}
			if rev != "" {
				v += " " + rev[:min(12, len(rev))] + dirty
			}
		}
	}
	return fmt.Sprintf("delayproxy %s (%s %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

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
