package bench

import (
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sys/unix"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/rawamqp"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// arrival is one delivery to the lateness benchmarks' consumer: the number
// its publisher gave it, when its last byte reached the consumer's socket
// (the kernel's receive time) and when the consumer's goroutine read it.
// Both are wall-clock readings, without the monotonic one (see
// benchLateness).
type arrival struct {
	id         int
	at, readAt time.Time
}

// stampedRead is one read of the consumer's socket: the stream offset just
// past its bytes and the receive time of the last segment it took.
type stampedRead struct {
	end int64
	at  time.Time
}

// stampedConn is the consumer's socket, read with the kernel's receive
// time of each read. Reads take at most stampedReadMax bytes, about one
// delivery of the lateness benchmarks, so that a read seldom takes
// segments that arrived apart: the kernel stamps a read with the last
// segment it took, and a message in an earlier one would read later than
// it arrived.
type stampedConn struct {
	rc    syscall.RawConn
	oob   []byte
	n     int64         // bytes read so far
	reads []stampedRead // from the oldest whose bytes are not all consumed
}

const stampedReadMax = 256

func (c *stampedConn) Read(p []byte) (int, error) {
	p = p[:min(len(p), stampedReadMax)]
	var n int
	var at time.Time
	var err error
	if rerr := c.rc.Read(func(fd uintptr) bool {
		n, at, err = recvStamped(int(fd), p, c.oob)
		return err != syscall.EAGAIN
	}); rerr != nil {
		return 0, rerr
	}
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.EOF
	}
	c.n += int64(n)
	c.reads = append(c.reads, stampedRead{c.n, at})
	return n, nil
}

// stampAt returns the receive time of the byte at stream offset off and
// forgets the reads before it.
func (c *stampedConn) stampAt(off int64) time.Time {
	i := 0
	for i < len(c.reads)-1 && c.reads[i].end <= off {
		i++
	}
	c.reads = c.reads[i:]
	return c.reads[0].at
}

// consumeStamped consumes queue straight on RabbitMQ at amqpURL, without
// acks, and sends each delivery's arrival; its id is the number in its
// message-id, or in its correlation-id when it has none. A raw client
// (rawamqp), not amqp091-go: it times each delivery where it reaches the
// socket, so that the lateness measured is not the consumer's own wait for
// the bench process's busy processors, and it costs those processors
// little.
func consumeStamped(b testing.TB, amqpURL, queue string, arrivals chan<- arrival) {
	b.Helper()
	c, err := rawamqp.DialURL(amqpURL, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	var reader sync.WaitGroup // the goroutine reading deliveries
	b.Cleanup(func() { close(done); c.Close(); reader.Wait() })
	rc, err := c.C.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	sock := &stampedConn{rc: rc}
	var serr error
	if err := rc.Control(func(fd uintptr) { sock.oob, serr = enableStamps(int(fd)) }); err != nil || serr != nil {
		b.Fatalf("receive timestamps: %v %v", err, serr)
	}
	if err := c.Send(1, &wire.BasicConsume{Queue: queue, NoAck: true}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Expect(1, wire.IDBasicConsumeOk); err != nil {
		b.Fatal(err)
	}
	// The queue is empty, so nothing came after consume-ok in the same
	// read; from here frames are read through the stamped socket.
	if c.R.Buffered().Buffered() != 0 {
		b.Fatal("frames buffered past basic.consume-ok")
	}
	r := wire.NewReader(sock, 1<<20)
	reader.Go(func() {
		var id int
		var left uint64 // body bytes still to come
		for {
			f, err := r.ReadFrame()
			if err != nil {
				return // closed at cleanup
			}
			switch f.Type {
			case wire.FrameHeader:
				h, err := wire.DecodeContentHeader(f.Payload)
				if err != nil {
					b.Error(err)
					return
				}
				p, err := wire.DecodeProperties(h.Properties)
				if err != nil {
					b.Error(err)
					return
				}
				if p.MessageID != "" {
					id, _ = strconv.Atoi(p.MessageID)
				} else {
					id, _ = strconv.Atoi(p.CorrelationID)
				}
				left = h.BodySize
			case wire.FrameBody:
				left -= uint64(len(f.Payload))
			default:
				continue
			}
			if left == 0 {
				end := sock.n - int64(r.Buffered().Buffered())
				select {
				case arrivals <- arrival{id, sock.stampAt(end - 1).Round(0), time.Now().Round(0)}:
				case <-done:
					return
				}
			}
		}
	})
}

// enableStamps turns on SO_TIMESTAMPNS on the socket fd and returns a
// buffer for recvStamped's control message.
func enableStamps(fd int) ([]byte, error) {
	return make([]byte, unix.CmsgSpace(16)), unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
}

// recvStamped reads into p with recvmsg and returns the kernel's receive
// time of the last segment read (SCM_TIMESTAMPNS, the wall clock), or
// the time now when there is none.
func recvStamped(fd int, p, oob []byte) (int, time.Time, error) {
	n, oobn, _, _, err := unix.Recvmsg(fd, p, oob, 0)
	if err != nil {
		return 0, time.Time{}, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return 0, time.Time{}, err
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			return n, time.Unix(int64(binary.NativeEndian.Uint64(m.Data)), int64(binary.NativeEndian.Uint64(m.Data[8:]))), nil
		}
	}
	return n, time.Now(), nil
}

func TestStampAt(t *testing.T) {
	at := func(ms int) time.Time { return time.UnixMilli(int64(ms)) }
	c := &stampedConn{reads: []stampedRead{{10, at(1)}, {20, at(2)}, {30, at(3)}}}
	for _, tt := range []struct {
		off  int64
		want time.Time
		left int
	}{
		{0, at(1), 3},
		{9, at(1), 3},
		{10, at(2), 2},
		{19, at(2), 2},
		{29, at(3), 1},
	} {
		if got := c.stampAt(tt.off); !got.Equal(tt.want) || len(c.reads) != tt.left {
			t.Errorf("stampAt(%d) = %v with %d reads left, want %v with %d", tt.off, got, len(c.reads), tt.want, tt.left)
		}
	}
}

// TestConsumeStamped consumes from the real broker: each delivery comes
// with its number, from the message-id or else the correlation-id, and
// arrives after it was published and before it was read.
func TestConsumeStamped(t *testing.T) {
	direct := testbroker.URL(t)
	ch := testbroker.Channel(t, testbroker.Dial(t, direct))
	q, err := ch.QueueDeclare("", false, true, false, false, nil) // gone with the consumer
	if err != nil {
		t.Fatal(err)
	}
	arrivals := make(chan arrival, 3)
	consumeStamped(t, direct, q.Name, arrivals)
	sent := []amqp.Publishing{
		{MessageId: "7", Body: payload64},
		{CorrelationId: "8", Body: make([]byte, 300_000)}, // several body frames
		{MessageId: "9"}, // no body frame
	}
	start := time.Now().Round(0)
	for _, m := range sent {
		if err := ch.Publish("", q.Name, false, false, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []int{7, 8, 9} {
		select {
		case a := <-arrivals:
			if a.id != want || a.at.Before(start) || a.readAt.Before(a.at) {
				t.Errorf("arrival %+v after publishing at %v, want id %d, published <= at <= readAt", a, start, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no delivery %d", want)
		}
	}
}
