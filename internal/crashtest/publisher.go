package crashtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AnswerTimeout is how long a Publisher waits for the answer to a publish
// (or for its connection to end) before it counts the publish as hung: the
// proxy must answer, close the channel or close the connection, never leave
// a client waiting.
const AnswerTimeout = 20 * time.Second

// Publisher publishes delayed messages with publisher confirms through one
// client connection at a time, dials again whenever the connection ends,
// and records the fate of every message-id it published. Set the fields,
// then call Run; read the ledger once Run returned.
type Publisher struct {
	// Name is the connection_name of every connection it opens (so that
	// RabbitMQ's connection list shows it) and the prefix of its
	// message-ids: Name-1, Name-2, ...
	Name string
	// URL is called before every dial: the proxy's address may change.
	URL func() string
	// Exchange is the delayed exchange published to, routing key "".
	Exchange string
	// Delay is the x-delay of the seq-th message (seq from 1).
	Delay func(seq uint64) time.Duration
	// Window is the most publishes awaiting their answer; default 32.
	Window int
	// Rate caps publishes per second; 0 publishes as fast as answers come.
	Rate float64
	// Body is the message body; nil means the message-id.
	Body []byte
	// Retry is the pause between dial attempts; default 50 ms.
	Retry time.Duration

	mu         sync.Mutex // guards the ledger below
	seq        uint64
	confirmed  []string
	nacked     []string
	unanswered []string // the channel or connection ended before the answer
	hung       int      // no answer and no close within AnswerTimeout
	dials      int      // dial attempts
	sessions   int      // connections opened
	ends       []End
}

// End is how one of a Publisher's connections ended.
type End struct {
	At  time.Time   // when the client learnt it
	Err *amqp.Error // nil: the client closed it (Run's context ended)
}

// Ledger is a copy of a Publisher's record.
type Ledger struct {
	Confirmed  []string // basic.ack seen: must be delivered
	Nacked     []string // basic.nack seen: refused, not stored
	Unanswered []string // the connection ended first: delivered or not
	Hung       int
	Dials      int
	Sessions   int
	Ends       []End
}

// Ledger returns a copy of the record so far.
func (p *Publisher) Ledger() Ledger {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Ledger{
		Confirmed:  slices.Clone(p.confirmed),
		Nacked:     slices.Clone(p.nacked),
		Unanswered: slices.Clone(p.unanswered),
		Hung:       p.hung,
		Dials:      p.dials,
		Sessions:   p.sessions,
		Ends:       slices.Clone(p.ends),
	}
}

// Run publishes until ctx ends, then waits for the answers still due (at
// most AnswerTimeout) and returns.
func (p *Publisher) Run(ctx context.Context) {
	if p.Window <= 0 {
		p.Window = 32
	}
	if p.Retry <= 0 {
		p.Retry = 50 * time.Millisecond
	}
	var pace *time.Ticker
	if p.Rate > 0 {
		pace = time.NewTicker(time.Duration(float64(time.Second) / p.Rate))
		defer pace.Stop()
	}
	for ctx.Err() == nil {
		p.mu.Lock()
		p.dials++
		p.mu.Unlock()
		conn, err := amqp.DialConfig(p.URL(), amqp.Config{
			Properties: amqp.Table{"connection_name": p.Name},
			Dial:       amqp.DefaultDial(5 * time.Second),
		})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(p.Retry):
			}
			continue
		}
		p.mu.Lock()
		p.sessions++
		p.mu.Unlock()
		p.session(ctx, conn, pace)
	}
}

// inflight is a publish awaiting its answer.
type inflight struct {
	id string
	dc *amqp.DeferredConfirmation
}

// session publishes over conn until ctx ends or conn closes.
func (p *Publisher) session(ctx context.Context, conn *amqp.Connection, pace *time.Ticker) {
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	var watched sync.WaitGroup
	watched.Go(func() {
		e, ok := <-closed
		p.mu.Lock()
		if ok {
			p.ends = append(p.ends, End{At: time.Now(), Err: e})
		} else {
			p.ends = append(p.ends, End{At: time.Now()})
		}
		p.mu.Unlock()
	})
	defer watched.Wait()
	defer conn.Close()

	ch, err := conn.Channel()
	if err != nil {
		return
	}
	if err := ch.Confirm(false); err != nil {
		return
	}
	var pending []inflight
	// settle records the answer of pending[0], which is done.
	settle := func() {
		f := pending[0]
		pending = pending[1:]
		p.mu.Lock()
		defer p.mu.Unlock()
		switch {
		case f.dc.Acked():
			p.confirmed = append(p.confirmed, f.id)
		case ch.IsClosed():
			// amqp091-go resolves every pending confirm as a nack
			// when the channel shuts down: not an answer.
			p.unanswered = append(p.unanswered, f.id)
		default:
			p.nacked = append(p.nacked, f.id)
		}
	}
	// awaitOldest waits for pending[0]'s answer; false if it hung.
	awaitOldest := func() bool {
		t := time.NewTimer(AnswerTimeout)
		defer t.Stop()
		select {
		case <-pending[0].dc.Done():
			settle()
			return true
		case <-t.C:
			p.mu.Lock()
			p.hung += len(pending)
			for _, f := range pending {
				p.unanswered = append(p.unanswered, f.id)
			}
			p.mu.Unlock()
			pending = nil
			return false
		}
	}
	for {
		for len(pending) > 0 && isDone(pending[0].dc) {
			settle()
		}
		if ctx.Err() != nil || ch.IsClosed() {
			for len(pending) > 0 {
				if !awaitOldest() {
					return
				}
			}
			return
		}
		if len(pending) >= p.Window {
			if !awaitOldest() {
				return
			}
			continue
		}
		if pace != nil {
			select {
			case <-pace.C:
			case <-ctx.Done():
				continue
			}
		}
		p.mu.Lock()
		p.seq++
		seq := p.seq
		p.mu.Unlock()
		id := p.Name + "-" + strconv.FormatUint(seq, 10)
		body := p.Body
		if body == nil {
			body = []byte(id)
		}
		msg := amqp.Publishing{
			Headers:      amqp.Table{"x-delay": p.Delay(seq).Milliseconds()},
			DeliveryMode: amqp.Persistent,
			MessageId:    id,
			Body:         body,
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), p.Exchange, "", false, false, msg)
		if err != nil {
			// Not sent, or cut off on the way: the proxy may have
			// read it or not.
			p.mu.Lock()
			p.unanswered = append(p.unanswered, id)
			p.mu.Unlock()
			continue
		}
		pending = append(pending, inflight{id: id, dc: dc})
	}
}

func isDone(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
	}
}

// Tally compares what publishers' ledgers say with the message-ids
// RabbitMQ delivered.
type Tally struct {
	Confirmed  int      // ids the proxy confirmed
	Nacked     int      // ids the proxy refused with basic.nack
	Unanswered int      // ids whose answer the client never saw
	Delivered  int      // deliveries counted
	Lost       []string // confirmed, never delivered: must be empty
	Duplicates int      // deliveries beyond the first of an id
	MaxCopies  int      // most deliveries of one id
	// UnansweredDelivered is how many unanswered ids were delivered:
	// stored before the fault, answer lost with the connection.
	UnansweredDelivered int
	// NackedDelivered is how many refused ids were delivered anyway:
	// must be 0 (a nack means the message was not stored).
	NackedDelivered int
	Unknown         int // delivered ids no ledger has
	Hung            int // publishes neither answered nor closed in time
}

// Count builds the Tally of ledgers against delivered message-ids.
func Count(ledgers []Ledger, delivered []string) Tally {
	copies := make(map[string]int, len(delivered))
	for _, id := range delivered {
		copies[id]++
	}
	tl := Tally{Delivered: len(delivered)}
	known := make(map[string]bool)
	for _, l := range ledgers {
		tl.Confirmed += len(l.Confirmed)
		tl.Nacked += len(l.Nacked)
		tl.Unanswered += len(l.Unanswered)
		tl.Hung += l.Hung
		for _, id := range l.Confirmed {
			known[id] = true
			if copies[id] == 0 {
				tl.Lost = append(tl.Lost, id)
			}
		}
		for _, id := range l.Nacked {
			known[id] = true
			if copies[id] > 0 {
				tl.NackedDelivered++
			}
		}
		for _, id := range l.Unanswered {
			known[id] = true
			if copies[id] > 0 {
				tl.UnansweredDelivered++
			}
		}
	}
	for id, n := range copies {
		if !known[id] {
			tl.Unknown++
		}
		tl.Duplicates += n - 1
		tl.MaxCopies = max(tl.MaxCopies, n)
	}
	return tl
}

// Missing is how many confirmed ids are not in delivered (id -> copies),
// for polling until everything arrived.
func Missing(ledgers []Ledger, delivered map[string]int) int {
	n := 0
	for _, l := range ledgers {
		for _, id := range l.Confirmed {
			if delivered[id] == 0 {
				n++
			}
		}
	}
	return n
}

// String summarises the tally for a test log.
func (tl Tally) String() string {
	return fmt.Sprintf("confirmed %d, nacked %d, unanswered %d (%d of them delivered), delivered %d, lost %d, duplicates %d (max copies %d), unknown %d, hung %d",
		tl.Confirmed, tl.Nacked, tl.Unanswered, tl.UnansweredDelivered, tl.Delivered, len(tl.Lost), tl.Duplicates, tl.MaxCopies, tl.Unknown, tl.Hung)
}

// Err is nil when the tally keeps the invariants: nothing confirmed lost,
// nothing refused delivered, nothing unknown delivered, nothing hung, and at
// most maxDup duplicates.
func (tl Tally) Err(maxDup int) error {
	var errs []error
	if len(tl.Lost) > 0 {
		errs = append(errs, fmt.Errorf("%d confirmed messages lost, first %v", len(tl.Lost), tl.Lost[:min(5, len(tl.Lost))]))
	}
	if tl.NackedDelivered > 0 {
		errs = append(errs, fmt.Errorf("%d nacked messages delivered", tl.NackedDelivered))
	}
	if tl.Unknown > 0 {
		errs = append(errs, fmt.Errorf("%d deliveries with message-ids no publisher sent", tl.Unknown))
	}
	if tl.Hung > 0 {
		errs = append(errs, fmt.Errorf("%d publishes neither answered nor closed within %v", tl.Hung, AnswerTimeout))
	}
	if tl.Duplicates > maxDup {
		errs = append(errs, fmt.Errorf("%d duplicates, more than the bound %d", tl.Duplicates, maxDup))
	}
	return errors.Join(errs...)
}
