package delayed_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/amqpproxy"
	"github.com/delayproxy/delayproxy/amqpproxy/delayed"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// declaration is one exchange.declare's flags and arguments.
type declaration struct {
	durable, autoDelete, internal bool
	args                          amqp.Table
}

// declareOn sends one exchange.declare on a fresh channel of conn and
// returns its error (nil for declare-ok). With noWait it waits briefly for
// the channel.close a refusal sends.
func declareOn(t *testing.T, conn *amqp.Connection, name, typ string, d declaration, noWait bool) error {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open channel: %v", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = ch.ExchangeDeclare(name, typ, d.durable, d.autoDelete, d.internal, noWait, d.args)
	if noWait && err == nil {
		select {
		case e := <-closed:
			if e != nil {
				return e
			}
		case <-time.After(time.Second):
		}
	}
	if err == nil {
		ch.Close()
	}
	return err
}

// reasonOf is the reply text of a 406, failing the test on anything else.
func reasonOf(t *testing.T, what string, err error) string {
	t.Helper()
	var e *amqp.Error
	if !errors.As(err, &e) || e.Code != amqp.PreconditionFailed {
		t.Fatalf("%s: %v, want 406 PRECONDITION_FAILED", what, err)
	}
	return e.Reason
}

// deleteOnBroker deletes an exchange straight on the broker in t.Cleanup.
func deleteOnBroker(t *testing.T, name string) {
	t.Cleanup(func() { testbroker.DeleteExchange(t, name) })
}

// TestRedeclareInequivalent: a delayed exchange redeclared through the proxy
// with other flags or arguments gets the answer RabbitMQ gives the same
// redeclare of a plain exchange, text for text, on whichever broker
// AMQP_URL names: RabbitMQ's own for durable, auto-delete, internal and
// alternate-exchange (checked in RabbitMQ's order, so a changed
// x-delayed-type does not hide them), and, for x-delayed-type alone, a 406
// that names x-delayed-type and both values as RabbitMQ words any
// inequivalent argument. Equivalent redeclares succeed; nothing changes
// the registered exchange or the real one.
func TestRedeclareInequivalent(t *testing.T) {
	b := testbroker.Default(t)
	r := startWireRelay(t, b, delayed.Config{}, amqpproxy.Config{})
	proxy := testbroker.Dial(t, r.url("guest", "guest"))
	broker := testbroker.Dial(t, b.URL)

	stamp := time.Now().UnixNano()
	ex := fmt.Sprintf("dp-delayed.redeclare.%d", stamp)
	orig := declaration{durable: true, args: amqp.Table{"x-delayed-type": "direct", "alternate-exchange": "ae1", "note": "v1"}}
	if err := declareOn(t, proxy, ex, delayed.TypeDelayed, orig, false); err != nil {
		t.Fatalf("declare: %v", err)
	}
	deleteOnBroker(t, ex)

	with := func(d declaration, f func(*declaration)) declaration {
		d.args = amqp.Table{}
		for k, v := range orig.args {
			d.args[k] = v
		}
		f(&d)
		return d
	}
	tests := []struct {
		name   string
		redecl declaration
		noWait bool
		// typeOnly: only x-delayed-type differs, so the proxy answers;
		// otherwise RabbitMQ's answer to a plain exchange is wanted.
		typeOnly bool
		ok       bool
	}{
		{name: "same", redecl: orig, ok: true},
		{name: "x-delayed-type as bytes", redecl: with(orig, func(d *declaration) { d.args["x-delayed-type"] = []byte("direct") }), ok: true},
		{name: "another unchecked argument", redecl: with(orig, func(d *declaration) { d.args["note"] = "v2" }), ok: true},
		{name: "x-delayed-type", redecl: with(orig, func(d *declaration) { d.args["x-delayed-type"] = "topic" }), typeOnly: true},
		{name: "x-delayed-type, no-wait", redecl: with(orig, func(d *declaration) { d.args["x-delayed-type"] = "fanout" }), typeOnly: true, noWait: true},
		{name: "durable", redecl: with(orig, func(d *declaration) { d.durable = false })},
		{name: "auto-delete", redecl: with(orig, func(d *declaration) { d.autoDelete = true })},
		{name: "internal", redecl: with(orig, func(d *declaration) { d.internal = true })},
		{name: "alternate-exchange", redecl: with(orig, func(d *declaration) { d.args["alternate-exchange"] = "ae2" })},
		{name: "no alternate-exchange", redecl: with(orig, func(d *declaration) { delete(d.args, "alternate-exchange") })},
		{name: "durable and x-delayed-type", redecl: with(orig, func(d *declaration) { d.durable = false; d.args["x-delayed-type"] = "topic" })},
		{name: "auto-delete and x-delayed-type", redecl: with(orig, func(d *declaration) { d.autoDelete = true; d.args["x-delayed-type"] = "headers" })},
		{name: "alternate-exchange and x-delayed-type", redecl: with(orig, func(d *declaration) { d.args["alternate-exchange"] = "ae2"; d.args["x-delayed-type"] = "topic" })},
	}
	for n, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := declareOn(t, proxy, ex, delayed.TypeDelayed, tt.redecl, tt.noWait)
			switch {
			case tt.ok:
				if got != nil {
					t.Fatalf("redeclare = %v, want declare-ok", got)
				}
			case tt.typeOnly:
				// RabbitMQ's wording of an inequivalent argument whose
				// values are both strings, from a plain exchange's
				// alternate-exchange changed the same way.
				probe := fmt.Sprintf("dp-delayed.redeclare.probe%d.%d", n, stamp)
				if err := declareOn(t, broker, probe, "direct", declaration{args: amqp.Table{"alternate-exchange": "direct"}}, false); err != nil {
					t.Fatal(err)
				}
				deleteOnBroker(t, probe)
				probeText := reasonOf(t, "the wording probe", declareOn(t, broker, probe, "direct",
					declaration{args: amqp.Table{"alternate-exchange": tt.redecl.args["x-delayed-type"]}}, false))
				want := strings.NewReplacer("'alternate-exchange'", "'x-delayed-type'", "'"+probe+"'", "'"+ex+"'").Replace(probeText)
				if text := reasonOf(t, "redeclare", got); text != want {
					t.Fatalf("redeclare answered\n  %q\nwant\n  %q", text, want)
				}
			default:
				// The same redeclare of a plain exchange declared as the
				// real one is: RabbitMQ's answer, with the name changed.
				plain := fmt.Sprintf("dp-delayed.redeclare.plain%d.%d", n, stamp)
				if err := declareOn(t, broker, plain, "direct", orig, false); err != nil {
					t.Fatal(err)
				}
				deleteOnBroker(t, plain)
				want := reasonOf(t, "RabbitMQ itself", declareOn(t, broker, plain, "direct", tt.redecl, false))
				want = strings.ReplaceAll(want, "'"+plain+"'", "'"+ex+"'")
				if text := reasonOf(t, "redeclare", got); text != want {
					t.Fatalf("redeclare answered\n  %q\nRabbitMQ answers\n  %q", text, want)
				}
			}
			if proxy.IsClosed() {
				t.Fatal("a channel error closed the connection")
			}
		})
	}

	// Nothing changed: the registry and RabbitMQ still have the original.
	def, ok := r.st.Exchange("/", ex)
	if !ok || def.DelayedType != "direct" || !def.Durable || def.AutoDelete || def.Internal {
		t.Errorf("registry after the redeclares: %+v, %v", def, ok)
	}
	if err := declareOn(t, broker, ex, "direct", declaration{durable: true, args: amqp.Table{"alternate-exchange": "ae1"}}, false); err != nil {
		t.Errorf("the real exchange is no longer a durable direct exchange with its alternate exchange: %v", err)
	}
}
