package amqpurl

import (
	"crypto/tls"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	given := &tls.Config{MinVersion: tls.VersionTLS13}
	tests := []struct {
		url                  string
		hostport, user, pass string
		tls, serverName      string
		err                  string
	}{
		{url: "amqp://rabbit/", hostport: "rabbit:5672", user: "guest", pass: "guest"},
		{url: "amqp://u:p%40ss@rabbit:5700/vh", hostport: "rabbit:5700", user: "u", pass: "p@ss"},
		{url: "amqp://u@[::1]/", hostport: "[::1]:5672", user: "u", pass: "guest"},
		{url: "AMQPS://rabbit.internal/", hostport: "rabbit.internal:5671", user: "guest", pass: "guest", tls: "yes", serverName: "rabbit.internal"},
		{url: "http://rabbit/", err: "scheme must be amqp or amqps"},
		{url: "amqp:///vhost", err: "has no host"},
		{url: "amqp://u:secret@rab bit/", err: "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			e, err := Parse(tt.url, given)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Parse = %+v, %v; want an error with %q", e, err, tt.err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Errorf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.HostPort != tt.hostport || e.User != tt.user || e.Password != tt.pass {
				t.Errorf("Parse = %+v, want %s as %s:%s", e, tt.hostport, tt.user, tt.pass)
			}
			if (e.TLS != nil) != (tt.tls != "") {
				t.Fatalf("TLS = %v, want it only for amqps", e.TLS)
			}
			if e.TLS != nil && (e.TLS.ServerName != tt.serverName || e.TLS.MinVersion != tls.VersionTLS13 || e.TLS == given) {
				t.Errorf("TLS = %+v, want a clone of the given config with ServerName %q", e.TLS, tt.serverName)
			}
		})
	}
}
