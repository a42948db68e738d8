package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqp091-go in the client suite: the same checks as the programs under
// testdata/clients, in the test's process, reported as lines of the same
// form.

// goClient runs the checks on one client suite run.
type goClient struct {
	ct     *clientTargets
	prefix string
	out    clientOutput
}

// runGoClient is amqp091-go's clientSpec.run.
func runGoClient(t *testing.T, ct *clientTargets, prefix string, _ *clientBuilds) clientOutput {
	t.Helper()
	g := &goClient{ct: ct, prefix: prefix, out: clientOutput{lines: map[resultKey]clientLine{}}}
	for _, target := range clientDirectAndProxy {
		g.run("server", target, func() (any, error) { return g.server(target) })
	}
	g.delayed(targetProxy, goDelayedCases, true)
	g.delayed(targetProxy32, []goDelayedCase{{"delay_int", "dx", "k", amqp.Table{"x-delay": clientDelayInt32}, clientDelayInt32}}, false)
	for _, target := range clientDirectAndProxy {
		g.plain(target)
	}
	for _, target := range []string{targetProxy, targetProxy32} {
		g.cleanup(target)
	}
	return g.out
}

// run reports f's result, or its error, as check on target.
func (g *goClient) run(check, target string, f func() (any, error)) {
	l := clientLine{Check: check, Target: target}
	v, err := f()
	if err == nil {
		var b []byte
		if b, err = json.Marshal(v); err == nil {
			err = json.Unmarshal(b, &l.Result)
		}
	}
	if err != nil {
		l.Error = err.Error()
	}
	g.out.lines[resultKey{check, target}] = l
}

func (g *goClient) name(target, suffix string) string {
	return g.prefix + "." + target + "." + suffix
}

func (g *goClient) dial(target string) (*amqp.Connection, error) {
	return amqp.Dial(g.ct.url(target))
}

// withChannel runs f on a new channel of a new connection to target.
func (g *goClient) withChannel(target string, f func(*amqp.Connection, *amqp.Channel) (any, error)) (any, error) {
	c, err := g.dial(target)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return nil, err
	}
	return f(c, ch)
}

func (g *goClient) server(target string) (any, error) {
	c, err := g.dial(target)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return map[string]any{"product": c.Properties["product"], "version": c.Properties["version"], "channel_max": c.Config.ChannelMax}, nil
}

// goDelayedCase is one delayed publish: the check it reports, the
// exchange's suffix, the routing key, the headers and the delay (-1: it
// must not arrive).
type goDelayedCase struct {
	check   string
	suffix  string
	key     string
	headers amqp.Table
	delay   int64
}

var goDelayedCases = []goDelayedCase{
	{"delay_int", "dx", "k", amqp.Table{"x-delay": clientDelayInt}, clientDelayInt},
	{"delay_string", "dx", "k", amqp.Table{"x-delay": fmt.Sprint(clientDelayString)}, clientDelayString},
	{"delay_float", "dx", "k", amqp.Table{"x-delay": 400.7}, clientDelayFloat},
	{"delay_zero", "dx", "k", amqp.Table{"x-delay": 0}, 0},
	{"delay_missing", "dx", "k", nil, 0},
	{"delay_topic_unroutable", "dt", "b.c", amqp.Table{"x-delay": clientDelayTopic}, -1},
	{"delay_topic", "dt", "a.b.c", amqp.Table{"x-delay": clientDelayTopic}, clientDelayTopic},
}

// goArrival is a message basic.get took, and when.
type goArrival struct {
	at      time.Time
	headers amqp.Table
}

// goPoll takes messages from queue with basic.get until every message-id of
// want has arrived, and 300 ms more.
func goPoll(ch *amqp.Channel, queue string, want ...string) (map[string]goArrival, error) {
	got := map[string]goArrival{}
	deadline := time.Now().Add(20 * time.Second)
	var quietUntil time.Time
	for time.Now().Before(deadline) {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return got, err
		}
		if ok {
			got[d.MessageId] = goArrival{time.Now(), d.Headers}
			continue
		}
		all := true
		for _, id := range want {
			if _, ok := got[id]; !ok {
				all = false
			}
		}
		if all {
			if quietUntil.IsZero() {
				quietUntil = time.Now().Add(300 * time.Millisecond)
			} else if time.Now().After(quietUntil) {
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return got, nil
}

// goXDelay is x-delay as amqp091-go decoded it: its text and Go type.
func goXDelay(h amqp.Table) (value, typ any) {
	v, ok := h["x-delay"]
	if !ok {
		return nil, nil
	}
	return fmt.Sprint(v), fmt.Sprintf("%T", v)
}

func (g *goClient) delayed(target string, cases []goDelayedCase, reportDeclare bool) {
	c, err := g.dial(target)
	if err != nil {
		for _, cs := range cases {
			g.run(cs.check, target, func() (any, error) { return nil, err })
		}
		return
	}
	defer c.Close()
	ch, err := c.Channel()
	if err == nil {
		decl := map[string]any{}
		for _, x := range []struct{ typ, suffix string }{{"direct", "dx"}, {"topic", "dt"}} {
			decl[x.typ] = "ok"
			if err := ch.ExchangeDeclare(g.name(target, x.suffix), "x-delayed-message", true, false, false, false,
				amqp.Table{"x-delayed-type": x.typ}); err != nil {
				decl[x.typ] = err.Error()
			}
		}
		if reportDeclare {
			g.run("declare", target, func() (any, error) { return decl, nil })
		}
	}
	q := g.name(target, "dq")
	if err == nil {
		err = ch.Confirm(false)
	}
	if err == nil {
		_, err = ch.QueueDeclare(q, false, false, true, false, nil)
	}
	if err == nil {
		err = ch.QueueBind(q, "k", g.name(target, "dx"), false, nil)
	}
	if err == nil {
		err = ch.QueueBind(q, "a.#", g.name(target, "dt"), false, nil)
	}
	type sent struct {
		at        time.Time
		confirmed bool
	}
	sentAt := map[string]sent{}
	var want []string
	for _, cs := range cases {
		if err != nil {
			break
		}
		at := time.Now()
		var dc *amqp.DeferredConfirmation
		dc, err = ch.PublishWithDeferredConfirmWithContext(context.Background(), g.name(target, cs.suffix), cs.key, false, false,
			amqp.Publishing{Headers: cs.headers, MessageId: cs.check, DeliveryMode: amqp.Persistent, Body: []byte("body of " + cs.check)})
		if err != nil {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ok, werr := dc.WaitContext(ctx)
		cancel()
		if werr != nil {
			err = werr
			break
		}
		sentAt[cs.check] = sent{at, ok}
		if cs.delay >= 0 {
			want = append(want, cs.check)
		}
	}
	var got map[string]goArrival
	if err == nil {
		got, err = goPoll(ch, q, want...)
	}
	for _, cs := range cases {
		if cs.delay < 0 {
			continue
		}
		g.run(cs.check, target, func() (any, error) {
			if err != nil {
				return nil, err
			}
			s := sentAt[cs.check]
			a, arrived := got[cs.check]
			r := map[string]any{"confirmed": s.confirmed, "arrived": arrived, "elapsed_ms": nil, "x_delay": nil, "x_delay_type": nil}
			if arrived {
				r["elapsed_ms"] = float64(a.at.Sub(s.at)) / float64(time.Millisecond)
				r["x_delay"], r["x_delay_type"] = goXDelay(a.headers)
			}
			if cs.check == "delay_topic" {
				_, r["unroutable_arrived"] = got["delay_topic_unroutable"]
			}
			return r, nil
		})
	}
}

func (g *goClient) cleanup(target string) {
	g.withChannel(target, func(_ *amqp.Connection, ch *amqp.Channel) (any, error) {
		for _, s := range []string{"dx", "dt"} {
			if err := ch.ExchangeDelete(g.name(target, s), false, false); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
}
