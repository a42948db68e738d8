package releaser

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// readable reports how many bytes arrive at c within d.
func readable(t *testing.T, c net.Conn, d time.Duration) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, 1<<20)
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got
		}
	}
}

func TestCorkConn(t *testing.T) {
	big := bytes.Repeat([]byte("b"), maxCork+1)
	tests := []struct {
		name     string
		writes   [][]byte
		heldBack int // bytes the peer must not see before uncork
	}{
		{"small writes are held back", [][]byte{[]byte("method"), []byte("header"), []byte("body")}, 16},
		{"a write past maxCork sends what was held", [][]byte{[]byte("first"), bytes.Repeat([]byte("x"), maxCork)}, maxCork},
		{"a write bigger than maxCork goes straight through", [][]byte{[]byte("first"), big}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := tcpPair(t)
			c := &corkConn{Conn: client}
			c.cork()
			var want []byte
			for _, w := range tt.writes {
				if n, err := c.Write(w); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				want = append(want, w...)
			}
			before := readable(t, server, 50*time.Millisecond)
			if !bytes.Equal(before, want[:len(want)-tt.heldBack]) {
				t.Fatalf("peer saw %d bytes while corked, want %d", len(before), len(want)-tt.heldBack)
			}
			c.uncork()
			after := readable(t, server, 200*time.Millisecond)
			if got := append(before, after...); !bytes.Equal(got, want) {
				t.Fatalf("peer got %d bytes in all, want %d in order", len(got), len(want))
			}
			// Uncorked, writes go straight through.
			c.Write([]byte("next"))
			if got := readable(t, server, 200*time.Millisecond); string(got) != "next" {
				t.Fatalf("uncorked write: peer got %q", got)
			}
		})
	}
}

// failingConn is a net.Conn whose writes fail; it records Close.
type failingConn struct {
	net.Conn
	closed bool
}

func (f *failingConn) Write([]byte) (int, error) { return 0, errors.New("connection reset") }
func (f *failingConn) Close() error              { f.closed = true; return nil }

func TestCorkConnFailedFlushClosesConnection(t *testing.T) {
	f := &failingConn{}
	c := &corkConn{Conn: f}
	c.cork()
	if _, err := c.Write([]byte("publish")); err != nil {
		t.Fatalf("corked write: %v", err)
	}
	c.uncork()
	if !f.closed {
		t.Fatal("a failed flush left the connection open: amqp091-go would wait for confirms of bytes never sent")
	}
	if _, err := c.Write([]byte("more")); err == nil {
		t.Fatal("a write after a failed flush succeeded")
	}
}
