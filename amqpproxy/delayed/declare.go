package delayed

import (
	"fmt"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// Exchange type and argument of the delayed-message plugin's API.
const (
	TypeDelayed    = "x-delayed-message"
	ArgDelayedType = "x-delayed-type"
)

// RealDeclare checks a non-passive declare of an x-delayed-message exchange
// and returns the declare the proxy sends upstream: the same exchange with
// the underlying type from x-delayed-type, arguments unchanged (x-delayed-type
// included, so a redeclare with other arguments fails upstream as it would
// with the plugin), and nowait off, since the proxy records the exchange only
// once RabbitMQ has declared it. Errors carry the plugin's codes and texts.
func RealDeclare(m *wire.ExchangeDeclare) (wire.ExchangeDeclare, error) {
	v, ok, err := m.Arguments.Get(ArgDelayedType)
	if err != nil {
		return wire.ExchangeDeclare{}, err // the codec's 501
	}
	typ, isString := v.(string)
	if b, isBytes := v.([]byte); isBytes {
		typ, isString = string(b), true
	}
	if !ok || !isString || typ == "" {
		return wire.ExchangeDeclare{}, wire.NewError(wire.PreconditionFailed,
			"Invalid argument, 'x-delayed-type' must be an existing exchange type")
	}
	if typ == TypeDelayed {
		return wire.ExchangeDeclare{}, wire.NewError(wire.PreconditionFailed,
			fmt.Sprintf("Invalid argument, '%s' can't be used for 'x-delayed-type'", TypeDelayed))
	}
	up := *m
	up.Type = typ
	up.NoWait = false
	return up, nil
}

// Def is the registry record of a declared delayed exchange.
func Def(vhost string, up *wire.ExchangeDeclare) *store.ExchangeDef {
	return &store.ExchangeDef{
		VHost:       vhost,
		Name:        up.Exchange,
		DelayedType: up.Type,
		Durable:     up.Durable,
		AutoDelete:  up.AutoDelete,
		Internal:    up.Internal,
		Arguments:   append([]byte(nil), up.Arguments...),
	}
}
