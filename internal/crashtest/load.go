package crashtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/rawamqp"
)

// Load is what each client connection does during a load run: on one
// confirm-mode channel it publishes delayed messages to Delayed, on a
// second it publishes plain messages to Queue (default exchange), and on a
// third it consumes Queue with manual acks.
type Load struct {
	Delayed string                         // a delayed exchange
	Queue   string                         // a plain queue
	Delay   func(seq uint64) time.Duration // x-delay of a client's seq-th delayed message
	Rate    float64                        // per connection, delayed and plain each
	Body    []byte
}

// LoadResult counts what the clients did. Plain and Acked are exact:
// at the end Acked plus the depth of Queue must equal Plain.
type LoadResult struct {
	Confirmed []string // delayed message-ids the proxy confirmed
	Nacked    int      // delayed publishes refused
	Plain     int      // plain publishes sent
	Acked     int      // deliveries of Queue acked
	Silent    int      // connections that got no delayed publish confirmed
	Errs      []error  // the first few client errors
}

// Clients are client connections (amqp091-go) opened for a load run.
type Clients struct {
	name  string
	conns []*amqp.Connection
}

// OpenClients opens n client connections to url, at most 32 handshakes at
// a time, named name-0 ... name-(n-1). On error the ones opened are closed.
func OpenClients(url, name string, n int) (*Clients, error) {
	cs := &Clients{name: name, conns: make([]*amqp.Connection, n)}
	err := openEach(n, func(i int) error {
		c, err := amqp.DialConfig(url, amqp.Config{
			Properties: amqp.Table{"connection_name": name + "-" + strconv.Itoa(i)},
			Dial:       amqp.DefaultDial(30 * time.Second),
		})
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		cs.conns[i] = c
		return nil
	})
	if err != nil {
		cs.Close()
		return nil, err
	}
	return cs, nil
}

// openEach calls open(i) for i in [0, n), at most 32 at a time (a burst of
// handshakes beyond that only queues in RabbitMQ), and returns the first
// error.
func openEach(n int, open func(i int) error) error {
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	var mu sync.Mutex // guards first
	var first error
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := open(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// Close closes every connection.
func (cs *Clients) Close() {
	var wg sync.WaitGroup
	for _, c := range cs.conns {
		if c != nil {
			wg.Go(func() { c.Close() })
		}
	}
	wg.Wait()
}

// Run makes every connection do l for d, then waits for the answers of the
// delayed publishes and for the consumers to stop (their unacked
// deliveries go back to the queue). Channels are closed at the end; the
// connections stay open, idle.
func (cs *Clients) Run(l Load, d time.Duration) LoadResult {
	var (
		mu  sync.Mutex // guards res
		res LoadResult
		wg  sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if len(res.Errs) < 10 {
			res.Errs = append(res.Errs, err)
		}
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for i, c := range cs.conns {
		wg.Go(func() {
			r, err := runConn(ctx, c, l, cs.name+"-"+strconv.Itoa(i))
			if err != nil {
				fail(fmt.Errorf("connection %d: %w", i, err))
			}
			mu.Lock()
			res.Confirmed = append(res.Confirmed, r.Confirmed...)
			if len(r.Confirmed) == 0 {
				res.Silent++
			}
			res.Nacked += r.Nacked
			res.Plain += r.Plain
			res.Acked += r.Acked
			mu.Unlock()
		})
	}
	wg.Wait()
	return res
}

// runConn is one connection's share of a load run.
func runConn(ctx context.Context, c *amqp.Connection, l Load, name string) (LoadResult, error) {
	var res LoadResult
	pubD, err := c.Channel()
	if err != nil {
		return res, err
	}
	defer pubD.Close()
	if err := pubD.Confirm(false); err != nil {
		return res, err
	}
	pubP, err := c.Channel()
	if err != nil {
		return res, err
	}
	defer pubP.Close()
	sub, err := c.Channel()
	if err != nil {
		return res, err
	}
	if err := sub.Qos(16, 0, false); err != nil {
		return res, err
	}
	deliveries, err := sub.Consume(l.Queue, name, false, false, false, false, nil)
	if err != nil {
		return res, err
	}
	var acked atomic.Int64
	var consumed sync.WaitGroup
	consumed.Go(func() {
		for d := range deliveries {
			if d.Ack(false) == nil {
				acked.Add(1)
			}
		}
	})

	type inflight struct {
		id string
		dc *amqp.DeferredConfirmation
	}
	var pending []inflight
	var errs []error
	tick := time.NewTicker(time.Duration(float64(time.Second) / l.Rate))
	defer tick.Stop()
	for seq := uint64(1); ; seq++ {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		if ctx.Err() != nil {
			break
		}
		id := name + "-" + strconv.FormatUint(seq, 10)
		dc, err := pubD.PublishWithDeferredConfirmWithContext(context.Background(), l.Delayed, "", false, false, amqp.Publishing{
			Headers:      amqp.Table{"x-delay": l.Delay(seq).Milliseconds()},
			DeliveryMode: amqp.Persistent,
			MessageId:    id,
			Body:         l.Body,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("delayed publish: %w", err))
			break
		}
		pending = append(pending, inflight{id, dc})
		if err := pubP.PublishWithContext(context.Background(), "", l.Queue, false, false, amqp.Publishing{MessageId: id, Body: l.Body}); err != nil {
			errs = append(errs, fmt.Errorf("plain publish: %w", err))
			break
		}
		res.Plain++
	}
	wctx, wcancel := context.WithTimeout(context.Background(), AnswerTimeout)
	defer wcancel()
	for _, f := range pending {
		ok, err := f.dc.WaitContext(wctx)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("no answer to delayed publish %s: %w", f.id, err))
		case ok:
			res.Confirmed = append(res.Confirmed, f.id)
		default:
			res.Nacked++
		}
	}
	// Cancel the consumer; RabbitMQ sends what it started before
	// cancel-ok, and closing the channel requeues what is not acked.
	if err := sub.Cancel(name, false); err != nil {
		errs = append(errs, fmt.Errorf("basic.cancel: %w", err))
	}
	consumed.Wait()
	if err := sub.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		errs = append(errs, fmt.Errorf("close consumer channel: %w", err))
	}
	res.Acked = int(acked.Load())
	return res, errors.Join(errs...)
}

// OpenIdle opens n raw connections to addr (handshake done, heartbeats
// off, no channel), at most 32 handshakes at a time. They cost this process
// a socket each and no goroutine, so the memory a proxy in the same process
// gains is the proxy's own.
func OpenIdle(addr string, n int, l rawamqp.Login) ([]*rawamqp.Conn, error) {
	conns := make([]*rawamqp.Conn, n)
	err := openEach(n, func(i int) error {
		c, err := rawamqp.Dial(addr, 30*time.Second)
		if err == nil {
			c.C.SetDeadline(time.Now().Add(30 * time.Second))
			if err = c.Open(l); err != nil {
				c.Close()
			}
			c.C.SetDeadline(time.Time{})
		}
		if err != nil {
			return fmt.Errorf("idle connection %d: %w", i, err)
		}
		// Drop the 64 KiB write buffer and the read buffer: an idle
		// client needs neither.
		c.R, c.W = nil, nil
		conns[i] = c
		return nil
	})
	if err != nil {
		CloseIdle(conns)
		return nil, err
	}
	return conns, nil
}

// CloseIdle closes raw connections (nil entries skipped).
func CloseIdle(conns []*rawamqp.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}
