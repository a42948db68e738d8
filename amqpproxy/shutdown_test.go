package amqpproxy

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestShutdownBetweenOpenOkAndRelay: a connection that has been sent
// connection.open-ok but whose relay has not started yet when Shutdown
// comes gets 320 CONNECTION_FORCED, not a bare hangup.
func TestShutdownBetweenOpenOkAndRelay(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{Upstream: testbroker.URL(t), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	inWindow := make(chan *session, 1)
	release := make(chan struct{})
	srv.beforeRelay = func(s *session) {
		inWindow <- s
		<-release
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})

	c := rawDial(t, l.Addr().String())
	c.open(rawLogin{})
	s := <-inWindow
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- srv.Shutdown(ctx)
	}()
	// Shutdown has taken the session (queued its close) before the relay
	// starts.
	deadline := time.Now().Add(10 * time.Second)
	for s.state.Load() != connProxyClosing {
		if time.Now().After(deadline) {
			t.Fatal("Shutdown did not close the connection waiting for its relay")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if cm := c.expectConnClose(); cm.ReplyCode != wire.ConnectionForced {
		t.Fatalf("closed with %+v, want 320", cm)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}
