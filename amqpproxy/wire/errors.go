package wire

import (
	"errors"
	"fmt"
)

// AMQP 0-9-1 reply codes (spec 1.2, constants).
const (
	ReplySuccess       = 200
	ContentTooLarge    = 311
	NoRoute            = 312
	NoConsumers        = 313
	ConnectionForced   = 320
	InvalidPath        = 402
	AccessRefused      = 403
	NotFound           = 404
	ResourceLocked     = 405
	PreconditionFailed = 406
	FrameError         = 501
	SyntaxError        = 502
	CommandInvalid     = 503
	ChannelError       = 504
	UnexpectedFrame    = 505
	ResourceError      = 506
	NotAllowed         = 530
	NotImplemented     = 540
	InternalError      = 541
)

// Sentinel errors of the codec. Decoders return an *Error that carries the
// reply code and names the method; errors.Is finds the sentinel inside it.
// Decoding failures are 501 FRAME_ERROR, as RabbitMQ's "cannot decode".
var (
	// ErrBadProtocolHeader: the peer's first 8 bytes were not AMQP 0-9-1's.
	ErrBadProtocolHeader = errors.New("wire: bad protocol header")
	// ErrShort: a frame, method, table or header ended before its fields did.
	ErrShort = NewError(FrameError, "truncated field")
	// ErrTrailing: a method's arguments had bytes after its last field.
	ErrTrailing = NewError(FrameError, "trailing bytes after the last field")
	// ErrUnknownMethod: a method frame named a class or method the spec
	// does not have (503 COMMAND_INVALID).
	ErrUnknownMethod = NewError(CommandInvalid, "unknown method")
	// ErrFieldType: a table or array held an unknown field type code.
	ErrFieldType = NewError(FrameError, "unknown field type")
	// ErrTooDeep: tables and arrays nested deeper than MaxTableDepth.
	ErrTooDeep = NewError(FrameError, "field tables nested too deep")
	// ErrTooLong: a value does not fit its wire type (a shortstr over 255
	// bytes, a longstr or table of 4 GiB): an encoding error, 502.
	ErrTooLong = NewError(SyntaxError, "value too long for its field")
	// ErrBadValue: a Go value that has no field-table encoding.
	ErrBadValue = NewError(SyntaxError, "value has no field-table type")
)

// Error is an AMQP protocol error: a reply code, its text, and the method
// that caused it (0 when none). Connection-level codes (5xx, 320, 402, 530)
// close the connection; the others close the channel.
type Error struct {
	Code     uint16
	Text     string
	ClassID  uint16
	MethodID uint16

	cause error // a sentinel this error refines, for errors.Is; may be nil
}

// NewError returns an *Error with the given reply code and text.
func NewError(code uint16, text string) *Error { return &Error{Code: code, Text: text} }

func (e *Error) Error() string {
	return fmt.Sprintf("amqp %d %s: %s", e.Code, ReplyText(e.Code), e.Text)
}

// Unwrap returns the sentinel error this one refines, if any.
func (e *Error) Unwrap() error { return e.cause }

// CloseMethod is the method that reports e to the peer, with reply-text
// as RabbitMQ writes it ("NOT_FOUND - no queue 'q'"): connection.close for a
// hard error, channel.close otherwise.
func (e *Error) CloseMethod() Method {
	text := ReplyText(e.Code)
	if e.Text != "" {
		text += " - " + e.Text
	}
	if e.Hard() {
		return &ConnectionClose{ReplyCode: e.Code, ReplyText: text, ClassID: e.ClassID, MethodID: e.MethodID}
	}
	return &ChannelClose{ReplyCode: e.Code, ReplyText: text, ClassID: e.ClassID, MethodID: e.MethodID}
}

// Hard reports whether the code closes the whole connection.
func (e *Error) Hard() bool { return IsHard(e.Code) }

// IsHard reports whether a reply code is a connection (hard) error.
func IsHard(code uint16) bool {
	switch code {
	case ConnectionForced, InvalidPath, FrameError, SyntaxError, CommandInvalid,
		ChannelError, UnexpectedFrame, ResourceError, NotAllowed, NotImplemented, InternalError:
		return true
	}
	return false
}

// ReplyText is the spec's name of a reply code, as RabbitMQ puts it at the
// start of reply-text ("NOT_FOUND - no queue 'x'").
func ReplyText(code uint16) string {
	switch code {
	case ReplySuccess:
		return "OK"
	case ContentTooLarge:
		return "CONTENT_TOO_LARGE"
	case NoRoute:
		return "NO_ROUTE"
	case NoConsumers:
		return "NO_CONSUMERS"
	case ConnectionForced:
		return "CONNECTION_FORCED"
	case InvalidPath:
		return "INVALID_PATH"
	case AccessRefused:
		return "ACCESS_REFUSED"
	case NotFound:
		return "NOT_FOUND"
	case ResourceLocked:
		return "RESOURCE_LOCKED"
	case PreconditionFailed:
		return "PRECONDITION_FAILED"
	case FrameError:
		return "FRAME_ERROR"
	case SyntaxError:
		return "SYNTAX_ERROR"
	case CommandInvalid:
		return "COMMAND_INVALID"
	case ChannelError:
		return "CHANNEL_ERROR"
	case UnexpectedFrame:
		return "UNEXPECTED_FRAME"
	case ResourceError:
		return "RESOURCE_ERROR"
	case NotAllowed:
		return "NOT_ALLOWED"
	case NotImplemented:
		return "NOT_IMPLEMENTED"
	case InternalError:
		return "INTERNAL_ERROR"
	}
	return "UNKNOWN"
}
