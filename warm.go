package delayproxy

import (
	"context"

	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/store"
)

// warmingStore is the store as the delayed-exchange layer sees it:
// recording a delayed exchange (or the first delivery-time message of an
// exchange) also has the releaser dial its connection to the vhost in the
// background, so the first release there does not wait for a dial.
// Start-up warms the vhosts already in the registry; this covers the ones
// that come later.
type warmingStore struct {
	delayed.Store
	warm func(vhost string)
}

// PutExchange records def, then warms its vhost's release connection.
func (s warmingStore) PutExchange(ctx context.Context, def *store.ExchangeDef) error {
	if err := s.Store.PutExchange(ctx, def); err != nil {
		return err
	}
	s.warm(def.VHost)
	return nil
}
