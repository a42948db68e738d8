package amqpproxy

import (
	"context"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/testserver"
)

// TestShutdownBetweenOpenOkAndRelay: a connection that has been sent
// connection.open-ok but whose relay has not started yet when Shutdown
// comes gets 320 CONNECTION_FORCED, not a bare hangup.
func TestShutdownBetweenOpenOkAndRelay(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{Upstream: testbroker.URL(t), Logger: testlog.New()})
	if err != nil {
		t.Fatal(err)
	}
	inWindow := make(chan *session, 1)
	release := make(chan struct{})
	srv.beforeRelay = func(s *session) {
		inWindow <- s
		<-release
	}
	c := rawDial(t, testserver.Serve(t, srv, ErrServerClosed))
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
