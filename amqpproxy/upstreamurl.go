package amqpproxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// upstreamAddr is where the proxy dials RabbitMQ.
type upstreamAddr struct {
	hostport string
	tls      *tls.Config // nil for amqp://
}

// parseUpstream reads an amqp:// or amqps:// URL. User, password and vhost
// in it are ignored: every client logs in with its own.
func parseUpstream(raw string, tlsConf *tls.Config) (upstreamAddr, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return upstreamAddr{}, fmt.Errorf("amqpproxy: upstream URL: %w", err)
	}
	var a upstreamAddr
	port := "5672"
	switch strings.ToLower(u.Scheme) {
	case "amqp":
	case "amqps":
		port = "5671"
		if tlsConf == nil {
			a.tls = &tls.Config{}
		} else {
			a.tls = tlsConf.Clone()
		}
		if a.tls.ServerName == "" {
			a.tls.ServerName = u.Hostname()
		}
	default:
		return upstreamAddr{}, fmt.Errorf("amqpproxy: upstream URL %q: scheme must be amqp or amqps", raw)
	}
	if u.Hostname() == "" {
		return upstreamAddr{}, fmt.Errorf("amqpproxy: upstream URL %q has no host", raw)
	}
	if u.Port() != "" {
		port = u.Port()
	}
	a.hostport = net.JoinHostPort(u.Hostname(), port)
	return a, nil
}
