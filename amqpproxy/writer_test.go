package amqpproxy

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// pipeWriter runs a client-bound writer over net.Pipe and collects what it
// writes as "type/channel/what" strings.
type pipeWriter struct {
	w    *writer
	out  chan string
	done chan struct{}
}

func startPipeWriter(t *testing.T, beat time.Duration) *pipeWriter {
	a, b := net.Pipe()
	pw := &pipeWriter{out: make(chan string, 100), done: make(chan struct{})}
	pw.w = &writer{conn: a, w: wire.NewWriter(a), q: newOutQueue(1 << 20), toClient: true, beat: beat,
		fail: func(err error) {}}
	go func() {
		defer close(pw.done)
		pw.w.run()
	}()
	go func() {
		r := wire.NewReader(b, 1<<20)
		for {
			f, err := r.ReadFrame()
			if err != nil {
				close(pw.out)
				return
			}
			s := fmt.Sprintf("%d/%d", f.Type, f.Channel)
			switch f.Type {
			case wire.FrameMethod:
				m, _ := wire.DecodeMethod(f.Payload)
				switch m := m.(type) {
				case *wire.BasicAck:
					s += fmt.Sprintf("/ack %d %v", m.DeliveryTag, m.Multiple)
				case *wire.BasicNack:
					s += fmt.Sprintf("/nack %d %v", m.DeliveryTag, m.Multiple)
				default:
					s += "/" + m.ID().String()
				}
			case wire.FrameBody:
				s += "/" + string(f.Payload)
			}
			pw.out <- s
		}
	}()
	t.Cleanup(func() {
		pw.w.q.close()
		<-pw.done
		b.Close()
	})
	return pw
}

func (pw *pipeWriter) expect(t *testing.T, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-pw.out:
			if got != w {
				t.Fatalf("wrote %q, want %q", got, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing written, want %q", w)
		}
	}
}

func relayItem(ch *Channel, typ uint8, payload []byte) outItem {
	return outItem{kind: itemRelay, ch: ch, buf: wire.AppendFrame(nil, wire.Frame{Type: typ, Channel: ch.id, Payload: payload})}
}

// TestWriterHoldsProxyFramesDuringContent: a confirm (or reply, or close)
// the proxy makes for a channel waits until a delivery being relayed on
// that channel is complete, and is dropped once the channel is closed.
func TestWriterHoldsProxyFramesDuringContent(t *testing.T) {
	pw := startPipeWriter(t, 0)
	ch := &Channel{id: 1, confirms: newConfirms()}
	other := &Channel{id: 2}
	ch.confirms.publish()
	ch.confirms.publish()
	q := pw.w.q
	q.push(relayItem(ch, wire.FrameMethod, wire.AppendMethod(nil, &wire.BasicDeliver{ConsumerTag: "c", DeliveryTag: 1})))
	q.push(relayItem(ch, wire.FrameHeader, wire.AppendContentHeader(nil, wire.ContentHeader{ClassID: 60, BodySize: 10})))
	q.pushNow(outItem{kind: itemLocalConfirm, ch: ch, tag: 2})
	q.pushNow(outItem{kind: itemReply, ch: ch, buf: methodFrame(nil, 1, &wire.BasicQosOk{})})
	q.pushNow(outItem{kind: itemLocalConfirm, ch: other, tag: 1}) // not in confirm mode: dropped
	q.push(relayItem(ch, wire.FrameBody, []byte("01234")))
	q.pushNow(outItem{kind: itemLocalConfirm, ch: ch, tag: 1, nack: true})
	q.push(relayItem(ch, wire.FrameBody, []byte("56789")))
	pw.expect(t, "1/1/basic.deliver", "2/1", "3/1/01234", "3/1/56789", "1/1/ack 2 false", "1/1/basic.qos-ok", "1/1/nack 1 false")

	// Channel closed on this hop: later confirms and replies are dropped,
	// lifecycle frames are not.
	ch.confirms.publish()
	q.push(relayItem(ch, wire.FrameMethod, wire.AppendMethod(nil, &wire.ChannelClose{ReplyCode: 404})))
	q.pushNow(outItem{kind: itemLocalConfirm, ch: ch, tag: 3})
	q.pushNow(outItem{kind: itemReply, ch: ch, buf: methodFrame(nil, 1, &wire.BasicQosOk{})})
	q.pushNow(outItem{kind: itemLifecycle, ch: ch, buf: methodFrame(nil, 1, &wire.ChannelCloseOk{})})
	pw.expect(t, "1/1/channel.close", "1/1/channel.close-ok")
}

// TestWriterTranslatesUpstreamConfirms: upstream tags become client tags;
// a multiple ack does not span a tag the proxy still holds.
func TestWriterTranslatesUpstreamConfirms(t *testing.T) {
	pw := startPipeWriter(t, 0)
	ch := &Channel{id: 3, confirms: newConfirms()}
	c := ch.confirms
	c.relay(c.publish()) // client 1 = upstream 1
	c.publish()          // client 2: local
	c.relay(c.publish()) // client 3 = upstream 2
	c.relay(c.publish()) // client 4 = upstream 3
	q := pw.w.q
	q.push(outItem{kind: itemConfirm, ch: ch, tag: 3, multiple: true})
	pw.expect(t, "1/3/ack 1 false", "1/3/ack 3 false", "1/3/ack 4 false")
	q.pushNow(outItem{kind: itemLocalConfirm, ch: ch, tag: 2, nack: true})
	pw.expect(t, "1/3/nack 2 false")
	// A channel without confirm.select seen: relayed as it came.
	q.push(outItem{kind: itemConfirm, ch: &Channel{id: 4}, tag: 9, multiple: true})
	pw.expect(t, "1/4/ack 9 true")
}

func TestWriterHeartbeatsWhenIdle(t *testing.T) {
	pw := startPipeWriter(t, 50*time.Millisecond)
	pw.expect(t, "8/0", "8/0")
	// A busy writer sends no heartbeats: frames count as liveness.
	ch := &Channel{id: 1}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				pw.w.q.push(relayItem(ch, wire.FrameMethod, wire.AppendMethod(nil, &wire.BasicQosOk{})))
			}
		}
	}()
	// Skip what was in flight when the frames started.
	for got := ""; got != "1/1/basic.qos-ok"; got = <-pw.out {
	}
	frames, beats := 0, 0
	end := time.After(500 * time.Millisecond)
	for {
		select {
		case s := <-pw.out:
			if s == "8/0" {
				beats++
			} else {
				frames++
			}
		case <-end:
			close(stop)
			wg.Wait()
			if beats > 1 || frames < 50 { // one may slip in if the machine stalls the pusher
				t.Fatalf("%d heartbeats among %d frames", beats, frames)
			}
			return
		}
	}
}

// TestOutQueueBackPressure: push blocks at the byte limit until the writer
// takes the items; pushNow never blocks; close wakes blocked pushers.
func TestOutQueueBackPressure(t *testing.T) {
	q := newOutQueue(100)
	big := outItem{buf: make([]byte, 60)}
	for range 2 { // 120 bytes: over the limit now
		if !q.push(big) {
			t.Fatal("push failed")
		}
	}
	pushed := make(chan bool)
	go func() { pushed <- q.push(big) }()
	select {
	case <-pushed:
		t.Fatal("push did not wait at the limit")
	case <-time.After(50 * time.Millisecond):
	}
	if !q.pushNow(big) {
		t.Fatal("pushNow failed")
	}
	items, closed := q.take(nil)
	if len(items) != 3 || closed {
		t.Fatalf("took %d items, closed %v", len(items), closed)
	}
	if !<-pushed {
		t.Fatal("push failed after room was made")
	}
	if !q.push(big) {
		t.Fatal("push failed")
	}
	go func() { pushed <- q.push(big) }()
	time.Sleep(20 * time.Millisecond)
	q.close()
	if <-pushed {
		t.Fatal("push succeeded on a closed queue")
	}
	if _, closed := q.take(nil); !closed {
		t.Fatal("take does not report the close")
	}
}

// TestOutQueueWakes: frames pushed quietly wake the writer only with wake,
// a later push, or a push that waits for room; every other push wakes it
// at once, and only the first of a batch sends a signal.
func TestOutQueueWakes(t *testing.T) {
	item := outItem{buf: make([]byte, 60)}
	tests := []struct {
		name  string
		steps func(q *outQueue)
		woken bool
	}{
		{"push", func(q *outQueue) { q.push(item) }, true},
		{"pushNow", func(q *outQueue) { q.pushNow(item) }, true},
		{"pushQuiet", func(q *outQueue) { q.pushQuiet(item) }, false},
		{"pushQuiet twice", func(q *outQueue) { q.pushQuiet(item); q.pushQuiet(item) }, false},
		{"pushQuiet, wake", func(q *outQueue) { q.pushQuiet(item); q.wake() }, true},
		{"pushQuiet, pushNow", func(q *outQueue) { q.pushQuiet(item); q.pushNow(item) }, true},
		{"wake on an empty queue", func(q *outQueue) { q.wake() }, false},
		{"pushQuiet, take, wake", func(q *outQueue) { q.pushQuiet(item); q.take(nil); q.wake() }, false},
		{"push, signal taken, push", func(q *outQueue) { q.push(item); <-q.ready; q.push(item) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := newOutQueue(1 << 20)
			tt.steps(q)
			select {
			case <-q.ready:
				if !tt.woken {
					t.Fatal("the writer was woken")
				}
			default:
				if tt.woken {
					t.Fatal("the writer was not woken")
				}
			}
		})
	}
	t.Run("pushQuiet waiting for room", func(t *testing.T) {
		q := newOutQueue(100)
		q.pushQuiet(item)
		q.pushQuiet(item) // 120 bytes: over the limit now
		pushed := make(chan bool)
		go func() { pushed <- q.pushQuiet(item) }()
		select {
		case <-q.ready: // the writer takes the queue, which makes room
		case <-time.After(5 * time.Second):
			t.Fatal("a push waiting for room did not wake the writer")
		}
		if items, _ := q.take(nil); len(items) != 2 {
			t.Fatalf("took %d items, want 2", len(items))
		}
		if !<-pushed {
			t.Fatal("push failed after room was made")
		}
	})
}

// TestInterceptConfirmsDuringDeliveries: local confirms for taken-over
// publishes must not land inside deliveries relayed on the same channel
// (large bodies split at frame_max 4096).
func TestInterceptConfirmsDuringDeliveries(t *testing.T) {
	t.Parallel()
	hooks := newTakeEveryThird(4, 5*time.Millisecond)
	p := startProxy(t, Config{Interceptor: hooks})
	q := testbroker.DeclareQueue(t, false, nil)
	feed := testbroker.DeclareQueue(t, false, nil)
	conn := p.dial(t, amqp.Config{FrameSize: 4096})
	ch := testbroker.Channel(t, conn)
	deliveries, err := ch.Consume(feed, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 30
	body := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16)
	producer := testbroker.Channel(t, testbroker.Dial(t, testbroker.URL(t)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			if err := producer.PublishWithContext(ctxTimeout(t, 10*time.Second), "", feed, false, false,
				amqp.Publishing{Body: append([]byte{byte(i)}, body...)}); err != nil {
				t.Error(err)
				return
			}
			var d amqp.Delivery
			select {
			case d = <-deliveries:
			case <-time.After(10 * time.Second):
				t.Errorf("delivery %d lost", i)
				return
			}
			if len(d.Body) == 0 || d.Body[0] != byte(i) || !bytes.Equal(d.Body[1:], body) {
				t.Errorf("delivery %d damaged (%d bytes)", i, len(d.Body))
				return
			}
		}
	}()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 200))
	fate := func(b string) (bool, bool) {
		if ack, ok := hooks.answer(b); ok {
			return ack, true
		}
		return true, true
	}
	for round := 0; ; round++ {
		checkConfirms(t, ch, confirms, uint64(round*200+1), fmt.Sprintf("during%d", round), q, 200, fate)
		select {
		case <-done:
		default:
			continue
		}
		break
	}
	<-done
	hooks.wg.Wait()
}
