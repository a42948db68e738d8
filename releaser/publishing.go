package releaser

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/store"
)

// publishing turns a stored message into what amqp091-go publishes: its
// properties as the client sent them, with x-delay = -Delay.
func publishing(m *store.Message) (amqp.Publishing, error) {
	p, err := wire.DecodeProperties(m.Properties)
	if err != nil {
		return amqp.Publishing{}, err
	}
	headers, err := tableOf(p.Headers)
	if err != nil {
		return amqp.Publishing{}, err
	}
	if headers == nil {
		headers = amqp.Table{}
	}
	headers["x-delay"] = -m.Delay
	pub := amqp.Publishing{
		Headers:         headers,
		ContentType:     p.ContentType,
		ContentEncoding: p.ContentEncoding,
		DeliveryMode:    p.DeliveryMode,
		Priority:        p.Priority,
		CorrelationId:   p.CorrelationID,
		ReplyTo:         p.ReplyTo,
		Expiration:      p.Expiration,
		MessageId:       p.MessageID,
		Type:            p.Type,
		UserId:          p.UserID,
		AppId:           p.AppID,
		Body:            m.Body,
	}
	if p.Flags&wire.FlagTimestamp != 0 {
		pub.Timestamp = time.Unix(int64(p.Timestamp), 0)
	}
	return pub, nil
}

// tableOf decodes a raw field table into amqp091-go's Table.
func tableOf(t wire.Table) (amqp.Table, error) {
	if len(t) == 0 {
		return nil, nil
	}
	m, err := t.Decode()
	if err != nil {
		return nil, err
	}
	out := make(amqp.Table, len(m))
	for k, v := range m {
		cv, err := fieldOf(v)
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		out[k] = cv
	}
	return out, nil
}

// fieldOf converts one decoded field value to amqp091-go's representation.
func fieldOf(v any) (any, error) {
	switch v := v.(type) {
	case wire.Table:
		return tableOf(v)
	case map[string]any:
		t, err := wire.EncodeTable(v)
		if err != nil {
			return nil, err
		}
		return tableOf(t)
	case wire.Decimal:
		return amqp.Decimal{Scale: v.Scale, Value: v.Value}, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			ce, err := fieldOf(e)
			if err != nil {
				return nil, err
			}
			out[i] = ce
		}
		return out, nil
	case nil, bool, int8, uint8, int16, uint16, int32, uint32, int64, float32, float64, string, []byte, time.Time:
		return v, nil
	}
	return nil, fmt.Errorf("unsupported field type %T", v)
}
