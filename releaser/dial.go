package releaser

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/amqpurl"
)

// preTuneFrameMax bounds the frames read before tune: connection.start
// with RabbitMQ's server properties, or a close.
const preTuneFrameMax = 64 << 10

// defaultFrameMax is the frame_max asked for when RabbitMQ sets no limit
// (0): RabbitMQ's own default.
const defaultFrameMax = 128 << 10

// dial connects to RabbitMQ for the releases of vhost: TCP (TLS for
// amqps), the protocol header, start/start-ok (PLAIN), tune/tune-ok,
// connection.open, then the release channel in confirm mode. It takes at
// most DialTimeout and ends early with ctx. It returns the connection with
// the reader of its socket; start runs them.
func (r *Releaser) dial(ctx context.Context, vhost string) (*conn, *wire.Reader, error) {
	deadline := time.Now().Add(r.cfg.DialTimeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var d net.Dialer
	sock, err := d.DialContext(ctx, "tcp", r.acct.HostPort)
	if err != nil {
		return nil, nil, err
	}
	if r.acct.TLS != nil {
		tc := tls.Client(sock, r.acct.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			sock.Close()
			return nil, nil, fmt.Errorf("TLS: %w", err)
		}
		sock = tc
	}
	// The handshake runs under the deadline, and ctx ending moves it to now.
	sock.SetDeadline(deadline)
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		sock.SetDeadline(time.Unix(1, 0))
	})
	c := &conn{
		vhost: vhost, sock: sock, log: r.cfg.Logger, metrics: r.cfg.Metrics, delayType: r.cfg.DelayType,
		replies: make(chan reply, 1), born: time.Now(), dead: make(chan struct{}), done: make(chan struct{}),
	}
	rd := wire.NewReader(c, preTuneFrameMax)
	err = c.handshake(rd, r.acct, r.cfg.Name+" "+vhost, r.cfg.Heartbeat)
	if !stop() {
		<-stopped
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			err = ctx.Err()
		}
	}
	if err != nil {
		sock.Close()
		return nil, nil, err
	}
	sock.SetDeadline(time.Time{})
	return c, rd, nil
}

// start runs c's reader, which reads with rd, and its heartbeat. r.mu is
// held and the Releaser is not closed, so Close waits for them.
func (r *Releaser) start(c *conn, rd *wire.Reader) {
	r.wg.Go(func() {
		c.read(rd)
		r.ended(c)
	})
	if c.heartbeat > 0 {
		r.wg.Go(c.beat)
	}
}

// handshake opens the connection and the release channel, synchronously,
// before the reader starts. A refusal from RabbitMQ (403 login, 530 vhost)
// is its *wire.Error.
func (c *conn) handshake(rd *wire.Reader, acct amqpurl.Endpoint, name string, heartbeat time.Duration) error {
	if _, err := c.sock.Write(wire.ProtocolHeader[:]); err != nil {
		return err
	}
	m, err := expect(c, rd, 0, wire.IDConnectionStart)
	if err != nil {
		return err
	}
	if mechs := m.(*wire.ConnectionStart).Mechanisms; !slices.Contains(strings.Fields(string(mechs)), "PLAIN") {
		return fmt.Errorf("RabbitMQ does not offer PLAIN login, only %q", mechs)
	}
	props, err := wire.EncodeTable(map[string]any{
		"product":         "delayproxy",
		"platform":        "Go",
		"connection_name": name,
		"capabilities": map[string]any{
			"authentication_failure_close": true, // a refused login is a 403, not a hang-up
			"basic.nack":                   true,
			"connection.blocked":           true,
			"publisher_confirms":           true,
		},
	})
	if err != nil {
		return err
	}
	if err := c.send(0, &wire.ConnectionStartOk{ClientProperties: props, Mechanism: "PLAIN",
		Response: []byte("\x00" + acct.User + "\x00" + acct.Password), Locale: "en_US"}); err != nil {
		return err
	}
	m, err = expect(c, rd, 0, wire.IDConnectionTune)
	if err != nil {
		return err
	}
	tune := m.(*wire.ConnectionTune)
	if tune.ChannelMax != 0 && tune.ChannelMax < declareChannel {
		return fmt.Errorf("RabbitMQ allows %d channels; the releaser needs %d", tune.ChannelMax, declareChannel)
	}
	if tune.FrameMax != 0 && tune.FrameMax < wire.FrameMinSize {
		return fmt.Errorf("RabbitMQ offers frame_max %d, below the protocol's %d", tune.FrameMax, wire.FrameMinSize)
	}
	frameMax := tune.FrameMax
	if frameMax == 0 {
		frameMax = defaultFrameMax
	}
	c.frameMax = int(frameMax)
	c.heartbeat = time.Duration(negotiateHeartbeat(tune.Heartbeat, heartbeat)) * time.Second
	if err := c.send(0, &wire.ConnectionTuneOk{ChannelMax: tune.ChannelMax, FrameMax: frameMax,
		Heartbeat: uint16(c.heartbeat / time.Second)}); err != nil {
		return err
	}
	rd.SetMaxFrame(frameMax)
	for _, step := range []struct {
		ch   uint16
		m    wire.Method
		want wire.MethodID
	}{
		{0, &wire.ConnectionOpen{VirtualHost: c.vhost}, wire.IDConnectionOpenOk},
		{releaseChannel, &wire.ChannelOpen{}, wire.IDChannelOpenOk},
		{releaseChannel, &wire.ConfirmSelect{}, wire.IDConfirmSelectOk},
	} {
		if err := c.send(step.ch, step.m); err != nil {
			return err
		}
		if _, err := expect(c, rd, step.ch, step.want); err != nil {
			return err
		}
	}
	return nil
}

// negotiateHeartbeat is the heartbeat in seconds: RabbitMQ's offer and
// ours, the smaller unless one is 0 (none), as RabbitMQ's own clients pick.
// Ours is rounded up to whole seconds.
func negotiateHeartbeat(offer uint16, want time.Duration) uint16 {
	ours := uint16(min(math.Ceil(want.Seconds()), math.MaxUint16))
	switch {
	case offer == 0:
		return ours
	case ours == 0:
		return offer
	}
	return min(offer, ours)
}

// expect reads the next method of the handshake, skipping heartbeats, and
// returns it if it is want on channel ch. A connection.close or a
// channel.close instead is returned as RabbitMQ's error (connection.close
// is answered with close-ok first).
func expect(c *conn, rd *wire.Reader, ch uint16, want wire.MethodID) (wire.Method, error) {
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return nil, fmt.Errorf("waiting for %v: %w", want, readError(err))
		}
		if f.Type == wire.FrameHeartbeat {
			continue
		}
		if f.Type != wire.FrameMethod {
			return nil, fmt.Errorf("waiting for %v: frame type %d on channel %d", want, f.Type, f.Channel)
		}
		m, err := wire.DecodeMethod(f.Payload)
		if err != nil {
			return nil, err
		}
		switch m := m.(type) {
		case *wire.ConnectionClose:
			c.send(0, &wire.ConnectionCloseOk{})
			return nil, serverError(m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID)
		case *wire.ChannelClose:
			return nil, serverError(m.ReplyCode, m.ReplyText, m.ClassID, m.MethodID)
		case *wire.ConnectionBlocked, *wire.ConnectionUnblocked:
			continue
		}
		if m.ID() != want || f.Channel != ch {
			return nil, fmt.Errorf("waiting for %v on channel %d: got %v on channel %d", want, ch, m.ID(), f.Channel)
		}
		return m, nil
	}
}
