package delayproxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy/admin"
	"github.com/delayproxy/delayproxy/internal/amqpurl"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

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
	// MaxReleasesFirst is the largest Config.ReleasesFirst accepted.
	MaxReleasesFirst = time.Minute
	// MaxReleaseWindow is the largest Config.ReleaseWindow accepted.
	MaxReleaseWindow = time.Hour
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
	// DataDir holds the store file; created if missing. Unused when Store
	// is set.
	DataDir string
	// Store selects the shared PostgreSQL store (cluster mode): a
	// postgres:// or postgresql:// URL in libpq syntax (several hosts and
	// target_session_attrs=read-write included). "" keeps the bbolt file
	// in DataDir.
	Store string
	// StoreSchema is the PostgreSQL schema of the store's tables (and of
	// the releaser lease), so that several clusters can share a database.
	StoreSchema string
	// HTTPAddr serves /metrics, /healthz, /readyz and the admin API.
	HTTPAddr string
	// AdminToken is the bearer token of the admin API; required when
	// HTTPAddr is not a loopback address.
	AdminToken string
	// ReleaseRate caps this node's releases per second (in cluster mode,
	// of the partitions it releases); 0 means unlimited.
	ReleaseRate float64
	// ReleasedDelayType is the field type of x-delay on a released message:
	// "int64" (a signed 64-bit 'l', what the plugin writes from RabbitMQ
	// 3.13) or "int32" (a signed 32-bit 'I', what it wrote up to 3.12; 'l'
	// where the value does not fit).
	ReleasedDelayType string
	// ReleaseWindow rounds every due time up to a multiple of it (since the
	// unix epoch) when a delayed publish is taken, so that messages
	// published within one window with the same delay are due together and
	// released by priority, never early; 0 keeps exact milliseconds. Whole
	// milliseconds, at most MaxReleaseWindow.
	ReleaseWindow time.Duration
	// ReleasesFirst holds back the storing of delayed publishes while
	// releases are written more than this after their due time (package
	// intake): an intake burst then slows, down to intake.MinWindow
	// message in Puts at once, rather than make the releases late. 0 turns
	// it off. At most MaxReleasesFirst.
	ReleasesFirst time.Duration
	// MaxDelay is the largest x-delay accepted; larger ones are refused
	// with 406 PRECONDITION_FAILED. It bounds x-opt-delivery-delay, and how
	// far ahead x-opt-delivery-time may be, alike.
	MaxDelay time.Duration
	// DeliveryTimeHeaders delays publishes to any exchange that carry
	// x-opt-delivery-time (absolute unix ms) or x-opt-delivery-delay (ms),
	// RabbitMQ 4.4's and Tanzu's API; false relays them untouched, for
	// RabbitMQ 4.4 itself to read.
	DeliveryTimeHeaders bool
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
		ListenAddr:          ":5673",
		UpstreamURL:         "amqp://guest:guest@localhost:5672/",
		DataDir:             "./data",
		StoreSchema:         "delayproxy",
		HTTPAddr:            "127.0.0.1:15673",
		MaxDelay:            10 * year,
		ReleasesFirst:       time.Millisecond,
		DeliveryTimeHeaders: true,
		ReleasedDelayType:   "int64",
		MaxMessageSize:      DefaultMaxMessageSize,
		HandshakeTimeout:    10 * time.Second, // RabbitMQ handshake_timeout
		Heartbeat:           60 * time.Second, // RabbitMQ heartbeat
		ShutdownGrace:       30 * time.Second,
		LogLevel:            "info",
		LogFormat:           "text",
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
	if err := checkStoreURL(c.Store); err != nil {
		return bad("store", "%v", err)
	}
	if err := pgstore.CheckSchema(c.StoreSchema); err != nil {
		return bad("store-schema", "%v", err)
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
	if c.ReleasedDelayType != "int64" && c.ReleasedDelayType != "int32" {
		return bad("released-delay-type", "%q is not one of int64, int32", c.ReleasedDelayType)
	}
	if c.ReleaseWindow < 0 || c.ReleaseWindow > MaxReleaseWindow || c.ReleaseWindow%time.Millisecond != 0 {
		return bad("release-window", "must be 0 or whole milliseconds up to %s, got %s", formatDuration(MaxReleaseWindow), formatDuration(c.ReleaseWindow))
	}
	if c.ReleasesFirst < 0 || c.ReleasesFirst > MaxReleasesFirst {
		return bad("releases-first", "must be 0 (off) or a duration up to %s, got %s", formatDuration(MaxReleasesFirst), formatDuration(c.ReleasesFirst))
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

// checkAMQPURL accepts what the releaser and the proxy's dialler will
// (amqpurl.Parse): amqp:// or amqps:// with a host.
func checkAMQPURL(s string) error {
	_, err := amqpurl.Parse(s, nil)
	return err
}

// checkStoreURL checks --store: empty, or a postgres:// URL. Its errors
// never repeat the password.
func checkStoreURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Error repeats the URL, password included: keep its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("not a valid URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("URL %q: scheme must be postgres or postgresql", u.Redacted())
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
