package store

import "errors"

// Sentinel errors of the contract. Callers match them with errors.Is;
// implementations wrap them with detail.
var (
	// ErrClosed: the store has been closed; nothing was written.
	ErrClosed = errors.New("store: closed")
	// ErrUnknownExchange: the call named an exchange that is not in the
	// registry (Put: not with the message's incarnation); nothing was
	// written.
	ErrUnknownExchange = errors.New("store: exchange is not a registered delayed exchange")
	// ErrFull: the store has no room left (disk full, size cap reached);
	// nothing of the failed commit was written.
	ErrFull = errors.New("store: no space left")
	// ErrInvalidMessage: Put was given a message that cannot be stored
	// (due time out of range, too large); nothing was written.
	ErrInvalidMessage = errors.New("store: invalid message")
	// ErrStop may be returned by a ScanKeys callback to end the scan early;
	// the scan then returns nil.
	ErrStop = errors.New("store: stop scan")
)
