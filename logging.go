package delayproxy

import (
	"io"
	"log/slog"
	"net/url"
)

var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
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
		slog.String("released_delay_type", c.ReleasedDelayType),
		slog.String("release_window", formatDuration(c.ReleaseWindow)),
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
