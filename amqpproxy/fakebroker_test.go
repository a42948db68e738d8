package amqpproxy

import (
	"bytes"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/amqpproxy/wire"
	"github.com/delayproxy/delayproxy/internal/testserver"
)

// fakeBroker is an in-memory AMQP peer in RabbitMQ's place, for unit tests
// of the session's state machine. It does the handshake, opens and closes
// channels, takes publishes in confirm mode and confirms them in patterns
// RabbitMQ seldom produces: single acks out of order, multiple acks over
// several tags, nacks. It records the fate of every message by body.
// Everything else it ignores.
type fakeBroker struct {
	t testing.TB
	l net.Listener

	mu    sync.Mutex        // guards truth
	truth map[string]bool   // body -> acked
	wg    sync.WaitGroup    // connection goroutines
	conns map[net.Conn]bool // guarded by mu
}

func startFakeBroker(t testing.TB) *fakeBroker {
	b := &fakeBroker{t: t, l: testserver.Listen(t), truth: map[string]bool{}, conns: map[net.Conn]bool{}}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for seed := uint64(1); ; seed++ {
			c, err := b.l.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns[c] = true
			b.mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				b.serve(c, seed)
			}()
		}
	}()
	t.Cleanup(func() {
		b.l.Close()
		b.mu.Lock()
		for c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *fakeBroker) url() string { return "amqp://" + b.l.Addr().String() }

func (b *fakeBroker) fate(body string) (ack, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ack, ok = b.truth[body]
	return ack, ok
}

type fakeChannel struct {
	confirm bool
	nextUp  uint64
	out     []uint64          // outstanding upstream tags, ascending
	bodies  map[uint64]string // upstream tag -> body
	inPub   bool
	gotHdr  bool
	left    uint64
	body    []byte
}

func (b *fakeBroker) serve(c net.Conn, seed uint64) {
	defer c.Close()
	rng := rand.New(rand.NewPCG(seed, 99))
	r := wire.NewReader(c, 1<<20)
	w := wire.NewWriter(c)
	if wire.ReadProtocolHeader(r.Buffered()) != nil {
		return
	}
	send := func(ch uint16, m wire.Method) error {
		_, err := w.Write(methodFrame(nil, ch, m))
		return err
	}
	frames := make(chan wire.Frame, 64)
	readErr := make(chan error, 1)
	go func() {
		for {
			f, err := r.ReadFrame()
			if err != nil {
				readErr <- err
				close(frames)
				return
			}
			f.Payload = bytes.Clone(f.Payload)
			frames <- f
		}
	}()
	defer func() {
		c.Close()
		for range frames { // let the reader goroutine finish
		}
	}()
	send(0, &wire.ConnectionStart{VersionMinor: 9, Mechanisms: []byte("PLAIN"), Locales: []byte("en_US")})
	w.Flush()
	expect := func(id wire.MethodID) bool {
		for f := range frames {
			if f.Type == wire.FrameHeartbeat {
				continue
			}
			got, _ := wire.PeekMethodID(f.Payload)
			return f.Type == wire.FrameMethod && got == id
		}
		return false
	}
	if !expect(wire.IDConnectionStartOk) {
		return
	}
	send(0, &wire.ConnectionTune{ChannelMax: 2047, FrameMax: 131072})
	w.Flush()
	if !expect(wire.IDConnectionTuneOk) || !expect(wire.IDConnectionOpen) {
		return
	}
	send(0, &wire.ConnectionOpenOk{})
	w.Flush()

	chans := map[uint16]*fakeChannel{}
	confirmSome := func(ch uint16, fc *fakeChannel, all bool) {
		for len(fc.out) > 0 {
			ack := rng.IntN(4) != 0
			var covered []uint64
			var tag uint64
			multiple := rng.IntN(2) == 0
			if multiple {
				i := rng.IntN(len(fc.out))
				covered, tag = fc.out[:i+1], fc.out[i]
			} else {
				i := rng.IntN(len(fc.out))
				covered, tag = fc.out[i:i+1], fc.out[i]
			}
			b.mu.Lock()
			for _, u := range covered {
				b.truth[fc.bodies[u]] = ack
				delete(fc.bodies, u)
			}
			b.mu.Unlock()
			if multiple {
				fc.out = fc.out[len(covered):]
			} else {
				i := 0
				for fc.out[i] != tag {
					i++
				}
				fc.out = append(fc.out[:i:i], fc.out[i+1:]...)
			}
			if ack {
				send(ch, &wire.BasicAck{DeliveryTag: tag, Multiple: multiple})
			} else {
				send(ch, &wire.BasicNack{DeliveryTag: tag, Multiple: multiple})
			}
			if !all && rng.IntN(2) == 0 {
				return
			}
		}
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			for id, fc := range chans {
				confirmSome(id, fc, true)
			}
			if w.Flush() != nil {
				return
			}
			continue
		case f, ok := <-frames:
			if !ok {
				return
			}
			fc := chans[f.Channel]
			switch f.Type {
			case wire.FrameHeartbeat:
				continue
			case wire.FrameHeader:
				if fc != nil && fc.inPub && !fc.gotHdr {
					fc.gotHdr = true
					fc.left, _ = bodySize(f.Payload)
					fc.body = fc.body[:0]
				}
			case wire.FrameBody:
				if fc != nil && fc.inPub && fc.gotHdr {
					fc.body = append(fc.body, f.Payload...)
					fc.left -= uint64(len(f.Payload))
				}
			case wire.FrameMethod:
				m, err := wire.DecodeMethod(f.Payload)
				if err != nil {
					return
				}
				switch m := m.(type) {
				case *wire.ChannelOpen:
					chans[f.Channel] = &fakeChannel{bodies: map[uint64]string{}}
					send(f.Channel, &wire.ChannelOpenOk{})
				case *wire.ChannelClose:
					delete(chans, f.Channel)
					send(f.Channel, &wire.ChannelCloseOk{})
				case *wire.ConfirmSelect:
					if fc == nil {
						continue
					}
					fc.confirm = true
					if !m.NoWait {
						send(f.Channel, &wire.ConfirmSelectOk{})
					}
				case *wire.BasicPublish:
					if fc != nil {
						fc.inPub, fc.gotHdr = true, false
					}
				case *wire.ConnectionClose:
					send(0, &wire.ConnectionCloseOk{})
					w.Flush()
					return
				}
			}
			if fc != nil && fc.inPub && fc.gotHdr && fc.left == 0 {
				fc.inPub = false
				if fc.confirm {
					fc.nextUp++
					fc.out = append(fc.out, fc.nextUp)
					fc.bodies[fc.nextUp] = string(fc.body)
					if rng.IntN(8) == 0 {
						confirmSome(f.Channel, fc, false)
					}
				}
			}
			if len(frames) == 0 && w.Flush() != nil {
				return
			}
		}
	}
}
