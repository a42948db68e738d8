package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testlog"
	"github.com/delayproxy/delayproxy/internal/testproxy"
)

// The operator commands are tested against a real proxy run in-process
// (delayproxy.New and Run, the real store in a temp dir, the test broker)
// holding messages published through it.

const cliToken = "cli-test-token-0123456789"

// cliProxy is a running proxy with the admin token cliToken.
type cliProxy struct {
	httpAddr string // host:port of the admin API
	amqpURL  string // the proxy's AMQP URL with the broker's credentials
}

// startCLIProxy runs a proxy until the test ends.
func startCLIProxy(t *testing.T) *cliProxy {
	t.Helper()
	cfg := testproxy.Config(t)
	cfg.AdminToken = cliToken
	r := testproxy.Start(t, cfg, testlog.New())
	t.Cleanup(func() {
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Errorf("proxy Run: %v", err)
		}
	})
	return &cliProxy{httpAddr: strings.TrimPrefix(r.HTTP(), "http://"), amqpURL: r.URL()}
}

// delayedMsg is a message to publish with a delay.
type delayedMsg struct {
	id, routingKey, body string
	delay                time.Duration
	priority             uint8
}

// declareAndPublish declares a direct delayed exchange through the proxy,
// publishes msgs to it with publisher confirms (so they are stored when it
// returns) and deletes the exchange on the broker when the test ends.
func (p *cliProxy) declareAndPublish(t *testing.T, msgs ...delayedMsg) string {
	t.Helper()
	name := testbroker.UniqueName(t, "cli")
	t.Cleanup(func() { testbroker.DeleteExchange(t, name) })
	conn := testbroker.Dial(t, p.amqpURL)
	defer conn.Close() // the status page and metrics tests count open connections
	ch := testbroker.Channel(t, conn)
	if err := ch.ExchangeDeclare(name, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "direct"}); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	p.publish(t, ch, name, msgs...)
	return name
}

// publishMore publishes more messages to an exchange of declareAndPublish.
func (p *cliProxy) publishMore(t *testing.T, name string, msgs ...delayedMsg) {
	t.Helper()
	conn := testbroker.Dial(t, p.amqpURL)
	defer conn.Close()
	p.publish(t, testbroker.Channel(t, conn), name, msgs...)
}

func (p *cliProxy) publish(t *testing.T, ch *amqp.Channel, name string, msgs ...delayedMsg) {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, name, m.routingKey, false, false, amqp.Publishing{
			Headers:   amqp.Table{"x-delay": m.delay.Milliseconds()},
			MessageId: m.id,
			Priority:  m.priority,
			Body:      []byte(m.body),
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %+v: not confirmed (%v)", m, err)
		}
	}
}

// api GETs path from the admin API with the token and decodes the JSON
// into a generic value, to compare with what --json prints.
func (p *cliProxy) api(t *testing.T, path string) any {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+p.httpAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+cliToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s = %s %s", path, resp.Status, body)
	}
	return decodeJSON(t, body)
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("not JSON: %v: %s", err, b)
	}
	return v
}

// cliResult is what one operator command did.
type cliResult struct {
	code           int
	stdout, stderr string
}

// cli runs an operator command in-process against p (unless args name
// another --server) with only env as its environment and stdin as its
// terminal input.
func (p *cliProxy) cli(t *testing.T, env map[string]string, stdin io.Reader, args ...string) cliResult {
	t.Helper()
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var stdout, stderr bytes.Buffer
	if !slices.Contains(args, "--server") {
		args = append(args, "--server", p.httpAddr)
	}
	code := runCLI(args, cliIO{
		getenv: func(k string) string { return env[k] },
		now:    time.Now,
		stdin:  stdin,
		stdout: &stdout,
		stderr: &stderr,
	})
	return cliResult{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// withToken is the environment of an operator who set the token.
var withToken = map[string]string{"DELAYPROXY_ADMIN_TOKEN": cliToken}

// tableRows splits a table into rows of cells (cells are separated by two
// or more spaces, as tabwriter pads them).
func tableRows(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		var cells []string
		for _, c := range strings.Split(line, "  ") {
			if c = strings.TrimSpace(c); c != "" {
				cells = append(cells, c)
			}
		}
		rows = append(rows, cells)
	}
	return rows
}
