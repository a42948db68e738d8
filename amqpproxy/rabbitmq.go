package amqpproxy

import (
	"fmt"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
)

func connCloseFrame(e *wire.Error) []byte {
	return methodFrame(nil, 0, &wire.ConnectionClose{ReplyCode: e.Code, ReplyText: replyText(e), ClassID: e.ClassID, MethodID: e.MethodID})
}

// replyText words a reply as RabbitMQ does: "NOT_FOUND - no queue 'x'"
// (the codec cuts it to 255 bytes on a rune boundary).
func replyText(e *wire.Error) string {
	return wire.ReplyText(e.Code) + " - " + e.Text
}

// payloadNoWait reports whether a method frame payload has its no-wait bit
// set (false for methods without one).
func payloadNoWait(id wire.MethodID, payload []byte) bool {
	switch id {
	case wire.IDExchangeDeclare, wire.IDExchangeDelete, wire.IDExchangeBind, wire.IDExchangeUnbind,
		wire.IDQueueDeclare, wire.IDQueueBind, wire.IDQueuePurge, wire.IDQueueDelete,
		wire.IDBasicConsume, wire.IDBasicCancel, wire.IDConfirmSelect:
		m, err := wire.DecodeMethod(payload)
		return err == nil && methodNoWait(m)
	}
	return false
}

func methodNoWait(m wire.Method) bool {
	switch m := m.(type) {
	case *wire.ExchangeDeclare:
		return m.NoWait
	case *wire.ExchangeDelete:
		return m.NoWait
	case *wire.ExchangeBind:
		return m.NoWait
	case *wire.ExchangeUnbind:
		return m.NoWait
	case *wire.QueueDeclare:
		return m.NoWait
	case *wire.QueueBind:
		return m.NoWait
	case *wire.QueuePurge:
		return m.NoWait
	case *wire.QueueDelete:
		return m.NoWait
	case *wire.BasicConsume:
		return m.NoWait
	case *wire.BasicCancel:
		return m.NoWait
	case *wire.ConfirmSelect:
		return m.NoWait
	}
	return false
}

// unexpectedFrame is RabbitMQ's 505 for a frame that breaks a content.
func unexpectedFrame(phase uint8, f wire.Frame, classID, methodID uint16) *wire.Error {
	text := "expected content body, got non content body frame instead"
	if phase == inHeader {
		text = "expected content header for class 60, got non content header frame instead"
	}
	return &wire.Error{Code: wire.UnexpectedFrame, Text: text, ClassID: classID, MethodID: methodID}
}

// erlBinary prints bytes as Erlang does in RabbitMQ's error texts.
func erlBinary(b []byte) string {
	if len(b) > 16 {
		b = b[:16]
	}
	out := []byte("<<")
	for i, c := range b {
		if i > 0 {
			out = append(out, ',')
		}
		out = fmt.Appendf(out, "%d", c)
	}
	return string(append(out, ">>"...))
}
