//go:build !linux

package amqpproxy

import "net"

// withRecvTime returns c as it is: receive times are read on Linux only.
func withRecvTime(c net.Conn) (net.Conn, recvTimer) { return c, nil }
