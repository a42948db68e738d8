package delayproxy

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Errors returned by LoadConfig that are not failures.
var (
	// ErrHelp: --help was given; the usage has been written to stderr.
	ErrHelp = flag.ErrHelp
	// ErrVersion: --version was given; print VersionString and exit 0.
	ErrVersion = errors.New("version requested")
)

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
		{name: "store", arg: "URL", env: true, value: (*stringValue)(&c.Store),
			usage: "shared PostgreSQL store (cluster mode): postgres://user@host1,host2/db?target_session_attrs=read-write; default: the bbolt file in --data-dir"},
		{name: "store-schema", arg: "NAME", env: true, value: (*stringValue)(&c.StoreSchema),
			usage: "PostgreSQL schema of the store's tables, created if missing; one per cluster sharing a database"},
		{name: "http-addr", arg: "ADDR", env: true, value: (*stringValue)(&c.HTTPAddr),
			usage: "HTTP address of /metrics, /healthz, /readyz and the admin API (/api/); a non-loopback address needs --admin-token"},
		{name: "admin-token", arg: "TOKEN", env: true, value: (*stringValue)(&c.AdminToken),
			usage: fmt.Sprintf("bearer token of the admin API, at least %d characters; prefer the environment or --admin-token-file to the command line", minTokenLen)},
		{name: "admin-token-file", arg: "FILE", env: true, value: (*stringValue)(tokenFile),
			usage: "file holding the admin token (e.g. a Docker secret); surrounding white space is ignored"},
		{name: "release-rate", arg: "N", env: true, value: (*floatValue)(&c.ReleaseRate),
			usage: "most messages released per second by this node; 0 = unlimited"},
		{name: "released-delay-type", arg: "TYPE", env: true, value: (*stringValue)(&c.ReleasedDelayType),
			usage: "field type of x-delay on released messages: int64 (signed 64-bit 'l', as the plugin on RabbitMQ 3.13+) or int32 (signed 32-bit 'I', as up to 3.12; 'l' where it does not fit)"},
		{name: "release-window", arg: "DURATION", env: true, value: (*durationValue)(&c.ReleaseWindow),
			usage: "round due times up to windows of this size (whole ms, at most 1h), so messages published together with the same delay are released by priority, never early; 0 = exact milliseconds"},
		{name: "releases-first", arg: "DURATION", env: true, value: (*durationValue)(&c.ReleasesFirst),
			usage: "while releases are written more than this after their due time, store new delayed publishes more slowly, so that releases keep their time; 0 = off"},
		{name: "max-delay", arg: "DURATION", env: true, value: (*durationValue)(&c.MaxDelay),
			usage: "largest x-delay accepted; above it a publish is refused with 406 (units: ms s m h d y)"},
		{name: "delivery-time-headers", arg: "BOOL", env: true, value: (*boolValue)(&c.DeliveryTimeHeaders),
			usage: "delay publishes to any exchange that carry x-opt-delivery-time (unix ms) or x-opt-delivery-delay (ms); false relays them untouched"},
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
