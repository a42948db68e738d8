package pgstore

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/store"
)

// The notification channels, each prefixed with the schema's name.
const (
	keysChannel     = "_keys"      // payload: node id, then the hex keys of messages due soon
	cancelChannel   = "_cancelled" // payload: as keysChannel, of messages due soon cancelled
	registryChannel = "_registry"  // payload: node id; the registry changed
)

// relistenDelay is the pause before the listener connects again after
// losing its connection.
const relistenDelay = time.Second

// channel is the full name of a notification channel.
func (s *Store) channel(c string) string { return s.schema + c }

// dialListener opens the listener's own connection and listens on the
// channels.
func (s *Store) dialListener(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.connCfg)
	if err != nil {
		return nil, err
	}
	for _, c := range []string{keysChannel, cancelChannel, registryChannel} {
		if _, err := conn.Exec(ctx, "LISTEN "+s.channel(c)); err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}

// listen delivers notifications until Close: registry changes reload the
// cache, keys go to Options.OnNotify, cancelled keys to Options.OnCancel. Every ReloadInterval, and after a
// lost connection, it reloads the registry whatever it heard: the
// backstop of a notification missed. conn is the first connection, from
// Open.
func (s *Store) listen(conn *pgx.Conn) {
	ctx := s.stopCtx // Close cancels it
	next := time.Now().Add(s.opts.ReloadInterval)
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = s.dialListener(ctx); err != nil {
				if ctx.Err() == nil {
					s.opts.Logger.Warn("store: listener cannot connect; retrying", "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(relistenDelay):
				}
				continue
			}
			s.reloadLogged(ctx)
			if s.opts.OnMissed != nil {
				s.opts.OnMissed()
			}
		}
		if time.Now().After(next) {
			s.reloadLogged(ctx)
			next = time.Now().Add(s.opts.ReloadInterval)
		}
		wctx, wcancel := context.WithDeadline(ctx, next)
		n, err := conn.WaitForNotification(wctx)
		wcancel()
		switch {
		case err == nil:
			s.notified(ctx, n.Channel, n.Payload)
		case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
			// time to reload, or Close
		default:
			s.opts.Logger.Warn("store: listener lost its connection; reconnecting", "err", err)
			_ = conn.Close(context.Background())
			conn = nil
		}
	}
	if conn != nil {
		_ = conn.Close(context.Background())
	}
}

// notified handles one notification; its own are skipped.
func (s *Store) notified(ctx context.Context, channel, payload string) {
	node, keys := parsePayload(payload)
	if node == s.node {
		return
	}
	switch channel {
	case s.channel(registryChannel):
		s.reloadLogged(ctx)
	case s.channel(keysChannel):
		if s.opts.OnNotify != nil && len(keys) > 0 {
			s.opts.OnNotify(keys)
		}
	case s.channel(cancelChannel):
		if s.opts.OnCancel != nil && len(keys) > 0 {
			cancelled := make([]store.Key, len(keys))
			for i, a := range keys {
				cancelled[i] = a.Key
			}
			s.opts.OnCancel(cancelled)
		}
	}
}

// parsePayload reads a payload notifyPayloads wrote: the sending node's id,
// then words "partition.key" (key in hex), separated by spaces. A word of
// a key alone (an older node's) has partition -1; words that are not a
// key, or whose partition is not one, are skipped.
func parsePayload(payload string) (node string, keys []Announced) {
	node, rest, _ := strings.Cut(payload, " ")
	for _, w := range strings.Fields(rest) {
		a := Announced{Partition: -1}
		if p, h, ok := strings.Cut(w, "."); ok {
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || n >= Partitions || len(p) > 1 {
				continue
			}
			a.Partition, w = n, h
		}
		if len(w) == 2*store.KeySize {
			if _, err := hex.Decode(a.Key[:], []byte(w)); err == nil {
				keys = append(keys, a)
			}
		}
	}
	return node, keys
}

// reloadLogged reloads the registry, logging a failure.
func (s *Store) reloadLogged(ctx context.Context) {
	if err := s.reload(ctx); err != nil && ctx.Err() == nil {
		s.opts.Logger.Warn("store: cannot read the registry", "err", err)
	}
}
