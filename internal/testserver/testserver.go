// Package testserver serves a server under test on a loopback port for
// the length of a test, and gives tests loopback listeners of their own.
package testserver

import (
	"errors"
	"net"
	"testing"
)

// Server is what Serve runs, such as an amqpproxy.Server.
type Server interface {
	Serve(net.Listener) error
	Close() error
}

// Serve listens on a loopback port and serves srv there until the end of
// the test; then it closes srv and checks that Serve returned closed (as
// errors.Is tells), such as amqpproxy.ErrServerClosed. It returns the
// address srv listens on.
func Serve(t testing.TB, srv Server, closed error) string {
	t.Helper()
	l := Listen(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, closed) {
			t.Errorf("Serve returned %v, want %v", err, closed)
		}
	})
	return l.Addr().String()
}

// Listen listens on a free loopback port until the end of the test.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
