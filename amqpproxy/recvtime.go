package amqpproxy

import "time"

// recvTimer tells when the bytes of a connection's last read reached this
// host (recvtime_linux.go). Only the goroutine that reads the connection
// calls it.
type recvTimer interface {
	// lastRecv is the kernel's receive time of the last read's bytes: every
	// byte that read returned arrived at or before it. The zero time when
	// unknown.
	lastRecv() time.Time
}
