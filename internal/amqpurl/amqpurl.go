// Package amqpurl reads the amqp:// and amqps:// URLs delayproxy dials
// RabbitMQ with: the client connections' upstream (amqpproxy) and the
// release account (releaser) alike.
package amqpurl

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Endpoint is where and as whom to dial RabbitMQ.
type Endpoint struct {
	// HostPort is host:port, with AMQP's default ports 5672 and 5671.
	HostPort string
	// TLS is nil for amqp://; for amqps:// a clone of the given config (or
	// the system defaults) whose ServerName is the URL's host unless set.
	TLS *tls.Config
	// User and Password are the URL's, guest and guest where it names none,
	// as amqp091-go reads them.
	User, Password string
}

// Parse reads an amqp:// or amqps:// URL with a host. Its vhost is left to
// the caller: both dial the vhost each connection is for.
func Parse(raw string, tlsConf *tls.Config) (Endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the URL, password included: keep its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return Endpoint{}, fmt.Errorf("not a valid URL: %w", err)
	}
	e := Endpoint{User: "guest", Password: "guest"}
	port := "5672"
	switch strings.ToLower(u.Scheme) {
	case "amqp":
	case "amqps":
		port = "5671"
		if tlsConf == nil {
			e.TLS = &tls.Config{}
		} else {
			e.TLS = tlsConf.Clone()
		}
		if e.TLS.ServerName == "" {
			e.TLS.ServerName = u.Hostname()
		}
	default:
		return Endpoint{}, fmt.Errorf("URL %q: scheme must be amqp or amqps", u.Redacted())
	}
	if u.Hostname() == "" {
		return Endpoint{}, fmt.Errorf("URL %q has no host", u.Redacted())
	}
	if u.Port() != "" {
		port = u.Port()
	}
	e.HostPort = net.JoinHostPort(u.Hostname(), port)
	if u.User != nil {
		e.User = u.User.Username()
		if p, ok := u.User.Password(); ok {
			e.Password = p
		}
	}
	return e, nil
}
