package e2e

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqp091-go's checks of plain traffic and refusals, each run straight to
// RabbitMQ and through the proxy (clients_go_test has the runner and the
// delayed checks).

// goRefusal is the code and text of the *amqp.Error err carries.
func goRefusal(err error) (any, error) {
	if err == nil {
		return map[string]any{"code": nil, "text": "not refused"}, nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return map[string]any{"code": ae.Code, "text": ae.Reason}, nil
	}
	return map[string]any{"code": nil, "text": err.Error()}, nil
}

func goNewQueue(ch *amqp.Channel) (string, error) {
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	return q.Name, err
}

func goCount(ch *amqp.Channel, q string) (int, error) {
	s, err := ch.QueueDeclarePassive(q, false, false, true, false, nil)
	return s.Messages, err
}

func goSend(ch *amqp.Channel, exchange, key string, p amqp.Publishing) error {
	return ch.PublishWithContext(context.Background(), exchange, key, false, false, p)
}

func goBody(s string) amqp.Publishing { return amqp.Publishing{Body: []byte(s)} }

// goFirstErr is the first non-nil error.
func goFirstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (g *goClient) plain(target string) {
	c, err := g.dial(target)
	if err != nil {
		g.run("get", target, func() (any, error) { return nil, err })
		return
	}
	onChannel := func(check string, f func(ch *amqp.Channel) (any, error)) {
		g.run(check, target, func() (any, error) {
			ch, err := c.Channel()
			if err != nil {
				return nil, err
			}
			return f(ch)
		})
	}
	onChannel("get", goGet)
	onChannel("consume_ack", goConsumeAck)
	onChannel("reject_requeue", goRejectRequeue)
	onChannel("qos", goQos)
	onChannel("quorum", func(ch *amqp.Channel) (any, error) { return goQuorum(ch, g.name(target, "qq")) })
	onChannel("mandatory", func(ch *amqp.Channel) (any, error) { return goMandatory(ch, g.name(target, "nowhere")) })
	onChannel("tx", goTx)
	if target == targetProxy {
		onChannel("tx_delayed", func(ch *amqp.Channel) (any, error) { return g.txDelayed(ch, target) })
	}
	onChannel("error_406_queue", func(ch *amqp.Channel) (any, error) {
		q := g.name(target, "eq")
		if _, err := ch.QueueDeclare(q, false, false, true, false, nil); err != nil {
			return nil, err
		}
		ch2, err := c.Channel()
		if err != nil {
			return nil, err
		}
		_, err = ch2.QueueDeclare(q, false, false, true, false, amqp.Table{"x-max-length": 10})
		return goRefusal(err)
	})
	onChannel("error_406_exchange", func(ch *amqp.Channel) (any, error) {
		x := g.name(target, "px")
		if err := ch.ExchangeDeclare(x, "direct", false, false, false, false, nil); err != nil {
			return nil, err
		}
		defer ch.ExchangeDelete(x, false, false)
		ch2, err := c.Channel()
		if err != nil {
			return nil, err
		}
		return goRefusal(ch2.ExchangeDeclare(x, "fanout", false, false, false, false, nil))
	})
	onChannel("error_404", func(ch *amqp.Channel) (any, error) {
		return goPublishRefused(ch, g.name(target, "missing"), goBody("m"))
	})
	if target == targetProxy {
		onChannel("error_406_delay", func(ch *amqp.Channel) (any, error) {
			return goPublishRefused(ch, g.name(target, "dx"), amqp.Publishing{Headers: amqp.Table{"x-delay": "abc"}})
		})
		onChannel("error_406_delayed_type", func(ch *amqp.Channel) (any, error) {
			return goRefusal(ch.ExchangeDeclare(g.name(target, "dx"), "x-delayed-message", true, false, false, false,
				amqp.Table{"x-delayed-type": "topic"}))
		})
	}
	c.Close()
	g.run("close_reopen", target, func() (any, error) { return g.closeReopen(target) })
	g.run("error_403", target, func() (any, error) {
		bad := "amqp://" + g.ct.user + ":wrong@" + g.ct.addrs[target] + "/%2f"
		c, err := amqp.Dial(bad)
		if err == nil {
			c.Close()
		}
		return goRefusal(err)
	})
	g.run("error_530", target, func() (any, error) {
		c, err := amqp.Dial("amqp://" + g.ct.user + ":" + g.ct.password + "@" + g.ct.addrs[target] + "/no-such-vhost")
		if err == nil {
			c.Close()
		}
		return goRefusal(err)
	})
}

// goPublishRefused publishes p to exchange and returns the channel.close
// that answers it, as NotifyClose reports it.
func goPublishRefused(ch *amqp.Channel, exchange string, p amqp.Publishing) (any, error) {
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := goSend(ch, exchange, "k", p); err != nil {
		return nil, err
	}
	select {
	case e := <-closed:
		if e == nil {
			return goRefusal(errors.New("channel closed without an error"))
		}
		return goRefusal(e)
	case <-time.After(10 * time.Second):
		return goRefusal(nil)
	}
}

func goGet(ch *amqp.Channel) (any, error) {
	q, err := goNewQueue(ch)
	if err != nil {
		return nil, err
	}
	if err := goSend(ch, "", q, goBody("hello")); err != nil {
		return nil, err
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok {
		return nil, goFirstErr(err, errors.New("basic.get-empty"))
	}
	_, again, err := ch.Get(q, true)
	if err != nil {
		return nil, err
	}
	return map[string]any{"body": string(d.Body), "redelivered": d.Redelivered, "message_count": d.MessageCount, "then_empty": !again}, nil
}

func goConsumeAck(ch *amqp.Channel) (any, error) {
	q, err := goNewQueue(ch)
	if err != nil {
		return nil, err
	}
	for _, b := range []string{"m1", "m2", "m3"} {
		if err := goSend(ch, "", q, goBody(b)); err != nil {
			return nil, err
		}
	}
	deliveries, err := ch.Consume(q, "c", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	var bodies []string
	for len(bodies) < 3 {
		select {
		case d := <-deliveries:
			bodies = append(bodies, string(d.Body))
			if err := d.Ack(false); err != nil {
				return nil, err
			}
		case <-time.After(5 * time.Second):
			return nil, fmt.Errorf("consumed %v, then nothing for 5 s", bodies)
		}
	}
	if err := ch.Cancel("c", false); err != nil {
		return nil, err
	}
	left, err := goCount(ch, q)
	return map[string]any{"bodies": bodies, "left": left}, err
}

func goRejectRequeue(ch *amqp.Channel) (any, error) {
	q, err := goNewQueue(ch)
	if err != nil {
		return nil, err
	}
	if err := goSend(ch, "", q, goBody("r")); err != nil {
		return nil, err
	}
	var redelivered []bool
	for _, settle := range []func(amqp.Delivery) error{
		func(d amqp.Delivery) error { return d.Reject(true) },
		func(d amqp.Delivery) error { return d.Nack(false, true) },
		func(d amqp.Delivery) error { return d.Ack(false) },
	} {
		d, ok, err := ch.Get(q, false)
		if err != nil || !ok {
			return nil, goFirstErr(err, errors.New("basic.get-empty"))
		}
		redelivered = append(redelivered, d.Redelivered)
		if err := settle(d); err != nil {
			return nil, err
		}
	}
	left, err := goCount(ch, q)
	return map[string]any{"redelivered": redelivered, "left": left}, err
}

func goQos(ch *amqp.Channel) (any, error) {
	q, err := goNewQueue(ch)
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return nil, err
	}
	for _, b := range []string{"a", "b"} {
		if err := goSend(ch, "", q, goBody(b)); err != nil {
			return nil, err
		}
	}
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	var got []amqp.Delivery
	// collect takes deliveries until there are n or d has passed.
	collect := func(n int, d time.Duration) {
		for timeout := time.After(d); len(got) < n; {
			select {
			case d := <-deliveries:
				got = append(got, d)
			case <-timeout:
				return
			}
		}
	}
	collect(1, 5*time.Second)
	collect(2, 300*time.Millisecond) // a second one must not come before the ack
	before := len(got)
	if before > 0 {
		if err := got[0].Ack(false); err != nil {
			return nil, err
		}
	}
	collect(2, 5*time.Second)
	for _, d := range got[1:] {
		d.Ack(false)
	}
	return map[string]any{"before_ack": before, "after_ack": len(got)}, nil
}

func goQuorum(ch *amqp.Channel, q string) (any, error) {
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return nil, err
	}
	defer ch.QueueDelete(q, false, false, false)
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, goBody("q"))
	if err != nil {
		return nil, err
	}
	if !dc.Wait() {
		return nil, errors.New("nacked")
	}
	var counts []any
	for _, settle := range []string{"reject", "nack", "reject", "ack"} {
		var d amqp.Delivery
		for deadline := time.Now().Add(10 * time.Second); ; {
			var ok bool
			if d, ok, err = ch.Get(q, false); err != nil {
				return nil, err
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return nil, errors.New("quorum queue empty for 10 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		counts = append(counts, d.Headers["x-delivery-count"])
		switch settle {
		case "reject":
			err = d.Reject(true)
		case "nack":
			err = d.Nack(false, true)
		default:
			err = d.Ack(false)
		}
		if err != nil {
			return nil, err
		}
	}
	return map[string]any{"counts": counts}, nil
}

func goMandatory(ch *amqp.Channel, key string) (any, error) {
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", key, true, false, goBody("m"))
	if err != nil {
		return nil, err
	}
	dc.Wait()
	select {
	case r := <-returns:
		return map[string]any{"reply_code": r.ReplyCode, "reply_text": r.ReplyText, "exchange": r.Exchange, "routing_key": r.RoutingKey}, nil
	case <-time.After(5 * time.Second):
		return map[string]any{"reply_code": nil}, nil
	}
}

func goTx(ch *amqp.Channel) (any, error) {
	q, err := goNewQueue(ch)
	if err != nil {
		return nil, err
	}
	if err := ch.Tx(); err != nil {
		return nil, err
	}
	if err := goFirstErr(goSend(ch, "", q, goBody("rolled back")), ch.TxRollback()); err != nil {
		return nil, err
	}
	afterRollback, err := goCount(ch, q)
	if err != nil {
		return nil, err
	}
	if err := goFirstErr(goSend(ch, "", q, goBody("committed")), ch.TxCommit()); err != nil {
		return nil, err
	}
	afterCommit, err := goCount(ch, q)
	return map[string]any{"after_rollback": afterRollback, "after_commit": afterCommit}, err
}

func (g *goClient) txDelayed(ch *amqp.Channel, target string) (any, error) {
	q := g.name(target, "txq")
	if _, err := ch.QueueDeclare(q, false, false, true, false, nil); err != nil {
		return nil, err
	}
	if err := ch.QueueBind(q, "tx", g.name(target, "dx"), false, nil); err != nil {
		return nil, err
	}
	if err := ch.Tx(); err != nil {
		return nil, err
	}
	var at time.Time
	for _, id := range []string{"rolled-back", "committed"} {
		at = time.Now()
		err := goSend(ch, g.name(target, "dx"), "tx", amqp.Publishing{Headers: amqp.Table{"x-delay": clientDelayTx}, MessageId: id})
		if id == "rolled-back" {
			err = goFirstErr(err, ch.TxRollback())
		} else {
			err = goFirstErr(err, ch.TxCommit())
		}
		if err != nil {
			return nil, err
		}
	}
	got, err := goPoll(ch, q, "committed")
	if err != nil {
		return nil, err
	}
	a, arrived := got["committed"]
	_, rolledBack := got["rolled-back"]
	r := map[string]any{"committed_arrived": arrived, "committed_elapsed_ms": nil, "committed_x_delay": nil, "rolled_back_arrived": rolledBack}
	if arrived {
		r["committed_elapsed_ms"] = float64(a.at.Sub(at)) / float64(time.Millisecond)
		r["committed_x_delay"], _ = goXDelay(a.headers)
	}
	return r, nil
}

// clientCloseRounds is how many connections close_reopen closes with
// confirms in flight: a reset after close-ok comes in a third to a half of them.
const clientCloseRounds = 10

// closeReopen closes, clientCloseRounds times, a connection with confirms
// in flight; it reports the first close that failed, then opens one more.
func (g *goClient) closeReopen(target string) (any, error) {
	var closeError any
	for range clientCloseRounds {
		e, err := g.closeWithConfirmsInFlight(target)
		if err != nil {
			return nil, err
		}
		if e != "" {
			closeError = e
			break
		}
	}
	_, err := g.withChannel(target, func(_ *amqp.Connection, ch *amqp.Channel) (any, error) { return goNewQueue(ch) })
	return map[string]any{"close_error": closeError, "reopened": err == nil}, nil
}

// closeWithConfirmsInFlight publishes 500 messages in confirm mode and
// closes the connection at once; it returns what went wrong with the
// close, "" if nothing.
func (g *goClient) closeWithConfirmsInFlight(target string) (string, error) {
	c, err := g.dial(target)
	if err != nil {
		return "", err
	}
	defer c.Close() // on the paths that return before its own close
	closed := c.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := c.Channel()
	if err != nil {
		return "", err
	}
	q, err := goNewQueue(ch)
	if err != nil {
		return "", err
	}
	if err := ch.Confirm(false); err != nil {
		return "", err
	}
	for range 500 {
		if err := goSend(ch, "", q, amqp.Publishing{Body: make([]byte, 1000)}); err != nil {
			return "", err
		}
	}
	if err := c.Close(); err != nil {
		return err.Error(), nil
	}
	// NotifyClose gets an error when the connection ended otherwise than
	// by the client's close: a reset after close-ok reads "EOF".
	if e, ok := <-closed; ok && e != nil {
		return e.Error(), nil
	}
	return "", nil
}
