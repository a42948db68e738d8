package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/crashtest"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

func TestCLIReads(t *testing.T) {
	p := startCLIProxy(t)
	long := strings.Repeat("x", 50)
	orders := p.declareAndPublish(t,
		delayedMsg{id: "a", routingKey: "rk-a", body: "A", delay: 30 * time.Minute},
		delayedMsg{id: "b", routingKey: "rk-b", body: "B1", delay: 2 * time.Hour, priority: 1},
		delayedMsg{id: "b", routingKey: "rk-b", body: "B2", delay: 2 * time.Hour},
		delayedMsg{id: "c", routingKey: "rk-c", body: long, delay: 72 * time.Hour},
	)
	other := p.declareAndPublish(t,
		delayedMsg{routingKey: "x", body: "soon", delay: 10 * time.Minute},
		delayedMsg{routingKey: "x", body: "late", delay: 10 * 24 * time.Hour},
	)
	path := "/api/exchanges/%2F/" + orders

	t.Run("exchanges", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "exchanges")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		rows := tableRows(r.stdout)
		if want := []string{"VHOST", "EXCHANGE", "TYPE", "PENDING", "NEXT DUE", "DUE IN"}; !reflect.DeepEqual(rows[0], want) {
			t.Errorf("header %q, want %q", rows[0], want)
		}
		api := p.api(t, path).(map[string]any)
		found := 0
		for _, row := range rows[1:] {
			switch row[1] {
			case orders:
				found++
				if row[0] != "/" || row[2] != "direct" || row[3] != "4" || row[4] != api["next_due"] || !strings.HasPrefix(row[5], "29m") {
					t.Errorf("orders row %q; API says %v", row, api)
				}
			case other:
				found++
				if row[3] != "2" {
					t.Errorf("other row %q", row)
				}
			}
		}
		if found != 2 {
			t.Errorf("table lacks the exchanges:\n%s", r.stdout)
		}
		if r := p.cli(t, withToken, nil, "exchanges", "--vhost", "no-such-vhost"); r.code != 0 || len(tableRows(r.stdout)) != 1 {
			t.Errorf("--vhost no-such-vhost: exit %d, %q", r.code, r.stdout)
		}
	})

	t.Run("exchanges --json", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "exchanges", "--json")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got, want := decodeJSON(t, []byte(r.stdout)), p.api(t, "/api/exchanges"); !reflect.DeepEqual(got, want) {
			t.Errorf("--json printed\n%s\nthe API says\n%v", r.stdout, want)
		}
	})

	t.Run("messages list", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "messages", "list", orders)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		rows := tableRows(r.stdout)
		if want := []string{"KEY", "DUE", "DUE IN", "PRIORITY", "ROUTING KEY", "MESSAGE ID"}; !reflect.DeepEqual(rows[0], want) {
			t.Errorf("header %q, want %q", rows[0], want)
		}
		api := p.api(t, path+"/messages").(map[string]any)["messages"].([]any)
		if len(rows) != 1+len(api) || len(api) != 4 {
			t.Fatalf("%d rows for %d messages:\n%s", len(rows)-1, len(api), r.stdout)
		}
		for i, m := range api {
			m := m.(map[string]any)
			want := []string{m["key"].(string), m["due"].(string), "", fmt.Sprint(m["priority"]), m["routing_key"].(string), m["message_id"].(string)}
			got := rows[i+1]
			want[2] = got[2] // "due in" moves with the clock
			if !reflect.DeepEqual(got, want) {
				t.Errorf("row %d = %q, want %q", i, got, want)
			}
		}
		// Release order: b with priority 1 before the other b.
		if rows[1][5] != "a" || rows[2][5] != "b" || rows[2][3] != "1" || rows[4][5] != "c" {
			t.Errorf("not in release order:\n%s", r.stdout)
		}

		// Flags after the argument, and pages: --limit, then --after.
		r = p.cli(t, withToken, nil, "messages", "list", orders, "--limit", "3")
		rows = tableRows(r.stdout)
		key3 := api[2].(map[string]any)["key"].(string)
		if r.code != 0 || len(rows) != 4 || !strings.Contains(r.stderr, "continue with --after "+key3) {
			t.Fatalf("--limit 3: exit %d, %d rows, stderr %q", r.code, len(rows)-1, r.stderr)
		}
		r = p.cli(t, withToken, nil, "messages", "list", "--after", key3, orders)
		rows = tableRows(r.stdout)
		if r.code != 0 || len(rows) != 2 || rows[1][5] != "c" || r.stderr != "" {
			t.Errorf("--after: exit %d, stderr %q:\n%s", r.code, r.stderr, r.stdout)
		}
	})

	t.Run("messages list --json", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "messages", "list", "--json", orders)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		if got, want := decodeJSON(t, []byte(r.stdout)), p.api(t, path+"/messages"); !reflect.DeepEqual(got, want) {
			t.Errorf("--json printed\n%s\nthe API says\n%v", r.stdout, want)
		}
		r = p.cli(t, withToken, nil, "messages", "list", "--json", "--body", "--limit", "1", orders)
		if got, want := decodeJSON(t, []byte(r.stdout)), p.api(t, path+"/messages?body=true&limit=1"); r.code != 0 || !reflect.DeepEqual(got, want) {
			t.Errorf("--json --body printed (exit %d)\n%s\nthe API says\n%v", r.code, r.stdout, want)
		}
	})

	t.Run("messages list --body", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "messages", "list", "--body", orders)
		rows := tableRows(r.stdout)
		if r.code != 0 || len(rows) != 5 {
			t.Fatalf("exit %d: %s\n%s", r.code, r.stderr, r.stdout)
		}
		if got := rows[0][6:]; !reflect.DeepEqual(got, []string{"SIZE", "BODY"}) {
			t.Errorf("header ends %q", got)
		}
		if got := rows[1][6:]; !reflect.DeepEqual(got, []string{"1", `"A"`}) {
			t.Errorf("a: %q", got)
		}
		if got := rows[4][6:]; !reflect.DeepEqual(got, []string{"50", `"` + long[:40] + `"...`}) {
			t.Errorf("c: %q", got)
		}
	})

	t.Run("messages count", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "messages", "count", orders)
		rows := tableRows(r.stdout)
		api := p.api(t, path).(map[string]any)
		if r.code != 0 || len(rows) != 2 {
			t.Fatalf("exit %d: %s\n%s", r.code, r.stderr, r.stdout)
		}
		if want := []string{"VHOST", "EXCHANGE", "PENDING", "NEXT DUE", "DUE IN"}; !reflect.DeepEqual(rows[0], want) {
			t.Errorf("header %q, want %q", rows[0], want)
		}
		if got := rows[1][:4]; !reflect.DeepEqual(got, []string{"/", orders, "4", api["next_due"].(string)}) {
			t.Errorf("row %q; API says %v", rows[1], api)
		}
		r = p.cli(t, withToken, nil, "messages", "count", orders, "--json")
		if r.code != 0 || !reflect.DeepEqual(decodeJSON(t, []byte(r.stdout)), api) {
			t.Errorf("--json printed (exit %d)\n%s\nthe API says\n%v", r.code, r.stdout, api)
		}
	})

	t.Run("upcoming", func(t *testing.T) {
		r := p.cli(t, withToken, nil, "upcoming")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		want := [][]string{
			{"DUE IN", "MESSAGES"},
			{"overdue", "0"},
			{"< 1m", "0"},
			{"1m - 1h", "2"}, // a, soon
			{"1h - 1d", "2"}, // b, b
			{"1d - 7d", "1"}, // c
			{">= 7d", "1"},   // late
			{"total", "6"},
		}
		if got := tableRows(r.stdout); !reflect.DeepEqual(got, want) {
			t.Errorf("table\n%s\nwant %q", r.stdout, want)
		}
		r = p.cli(t, withToken, nil, "upcoming", "--json")
		got := decodeJSON(t, []byte(r.stdout)).(map[string]any)
		api := p.api(t, "/api/upcoming").(map[string]any)
		counts := func(v map[string]any) (out []string) {
			for _, rg := range v["ranges"].([]any) {
				rg := rg.(map[string]any)
				out = append(out, fmt.Sprint(rg["name"], "=", rg["count"]))
			}
			return out
		}
		if r.code != 0 || got["total"] != api["total"] || !reflect.DeepEqual(counts(got), counts(api)) || len(got) != len(api) {
			t.Errorf("--json printed (exit %d)\n%s\nthe API says\n%v", r.code, r.stdout, api)
		}
	})
}

func TestCLICancel(t *testing.T) {
	p := startCLIProxy(t)
	ex := p.declareAndPublish(t,
		delayedMsg{id: "a", delay: time.Hour},
		delayedMsg{id: "b", delay: time.Hour},
		delayedMsg{id: "b", delay: time.Hour},
		delayedMsg{id: "c", delay: time.Hour},
	)
	count := func() string {
		t.Helper()
		r := p.cli(t, withToken, nil, "messages", "count", ex)
		return tableRows(r.stdout)[1][2]
	}
	what := fmt.Sprintf("of delayed exchange %q in vhost \"/\"", ex)

	r := p.cli(t, withToken, nil, "messages", "cancel", ex, "--message-id", "a")
	if r.code != 0 || r.stdout != "cancelled 1 pending message "+what+"\n" {
		t.Errorf("--message-id a: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r = p.cli(t, withToken, nil, "messages", "cancel", ex, "--message-id", "a")
	if r.code != exitNoMatch || !strings.Contains(r.stderr, `no pending message with message-id "a"`) {
		t.Errorf("--message-id a again: exit %d, %q", r.code, r.stderr)
	}
	r = p.cli(t, withToken, nil, "messages", "cancel", ex, "--message-id", "b", "--json")
	if r.code != 0 || !reflect.DeepEqual(decodeJSON(t, []byte(r.stdout)), map[string]any{"cancelled": 2.0}) {
		t.Errorf("--message-id b --json: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	list := p.cli(t, withToken, nil, "messages", "list", ex)
	key := tableRows(list.stdout)[1][0] // c
	r = p.cli(t, withToken, nil, "messages", "cancel", ex, "--key", key)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "cancelled 1 ") {
		t.Errorf("--key: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r = p.cli(t, withToken, nil, "messages", "cancel", ex, "--key", key)
	if r.code != exitNoMatch {
		t.Errorf("--key again: exit %d, %q", r.code, r.stderr)
	}
	if n := count(); n != "0" {
		t.Errorf("pending %s after cancelling all four one way or another", n)
	}
	r = p.cli(t, withToken, nil, "messages", "cancel", ex, "--all", "--yes")
	if r.code != exitNoMatch || !strings.Contains(r.stderr, "holds no pending messages") {
		t.Errorf("--all on an empty exchange: exit %d, %q", r.code, r.stderr)
	}

	// --all asks on the terminal.
	p.publishMore(t, ex, delayedMsg{delay: time.Hour}, delayedMsg{delay: time.Hour}, delayedMsg{delay: time.Hour})
	prompt := "Cancel all 3 pending messages " + what + "? They will never be released. [y/N] "
	for _, answer := range []string{"n\n", "\n", "", "yes please\n"} {
		r = p.cli(t, withToken, strings.NewReader(answer), "messages", "cancel", ex, "--all")
		if r.code != exitFailure || !strings.HasPrefix(r.stderr, prompt) || !strings.Contains(r.stderr, "not confirmed: nothing cancelled") || r.stdout != "" {
			t.Errorf("answer %q: exit %d, stdout %q, stderr %q", answer, r.code, r.stdout, r.stderr)
		}
	}
	if n := count(); n != "3" {
		t.Errorf("pending %s after declining, want 3", n)
	}
	r = p.cli(t, withToken, strings.NewReader("y\n"), "messages", "cancel", ex, "--all")
	if r.code != 0 || r.stderr != prompt || r.stdout != "cancelled 3 pending messages "+what+"\n" {
		t.Errorf("answer y: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// --yes does not read the terminal.
	p.publishMore(t, ex, delayedMsg{delay: time.Hour}, delayedMsg{delay: time.Hour})
	r = p.cli(t, withToken, failingReader{t}, "messages", "cancel", ex, "--all", "--yes", "--json")
	if r.code != 0 || r.stderr != "" || !reflect.DeepEqual(decodeJSON(t, []byte(r.stdout)), map[string]any{"cancelled": 2.0}) {
		t.Errorf("--all --yes: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(); n != "0" {
		t.Errorf("pending %s after --all --yes", n)
	}
}

// failingReader fails the test when read: the terminal must not be asked.
type failingReader struct{ t *testing.T }

func (f failingReader) Read([]byte) (int, error) {
	f.t.Error("read the terminal")
	return 0, fmt.Errorf("unexpected read")
}

func TestCLIErrors(t *testing.T) {
	p := startCLIProxy(t)
	ex := p.declareAndPublish(t, delayedMsg{id: "a", delay: time.Hour})
	dir := t.TempDir()
	goodFile := filepath.Join(dir, "token")
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(goodFile, []byte("  "+cliToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(emptyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := map[string]string{"DELAYPROXY_ADMIN_TOKEN": "wrong-token-0123456789"}
	tests := []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"unreachable", withToken, []string{"exchanges", "--server", crashtest.FreePort(t)}, exitUnreachable, "cannot reach delayproxy at http://127.0.0.1:"},
		{"unreachable, messages", withToken, []string{"messages", "count", ex, "--server", "http://" + crashtest.FreePort(t)}, exitUnreachable, "connection refused"},
		{"no token", nil, []string{"exchanges"}, exitUnauthorized, "the server wants the admin token: set DELAYPROXY_ADMIN_TOKEN or pass --admin-token-file"},
		{"no token, cancel", nil, []string{"messages", "cancel", ex, "--all", "--yes"}, exitUnauthorized, "wants the admin token"},
		{"wrong token", wrong, []string{"upcoming"}, exitUnauthorized, "the server refused the admin token from DELAYPROXY_ADMIN_TOKEN"},
		{"wrong token file", nil, []string{"exchanges", "--admin-token-file", emptyFile + "x"}, exitFailure, "no such file"},
		{"empty token file", nil, []string{"exchanges", "--admin-token-file", emptyFile}, exitFailure, "is empty"},
		{"token file", nil, []string{"messages", "count", ex, "--admin-token-file", goodFile}, exitOK, ""},
		{"token file beats the variable", wrong, []string{"messages", "count", ex, "--admin-token-file", goodFile}, exitOK, ""},
		{"DELAYPROXY_ADMIN_TOKEN_FILE", map[string]string{"DELAYPROXY_ADMIN_TOKEN_FILE": goodFile}, []string{"upcoming"}, exitOK, ""},
		{"unknown exchange, list", withToken, []string{"messages", "list", "nope"}, exitNoExchange, `no delayed exchange "nope" in vhost "/"`},
		{"unknown exchange, count", withToken, []string{"messages", "count", "nope"}, exitNoExchange, `no delayed exchange "nope"`},
		{"unknown exchange, cancel", withToken, []string{"messages", "cancel", "nope", "--message-id", "a"}, exitNoExchange, `no delayed exchange "nope"`},
		{"unknown vhost", withToken, []string{"messages", "count", ex, "--vhost", "nope"}, exitNoExchange, `in vhost "nope"`},
		{"no exchange given", withToken, []string{"messages", "list"}, exitUsage, "missing EXCHANGE"},
		{"two exchanges", withToken, []string{"messages", "count", ex, "more"}, exitUsage, `unexpected argument "more"`},
		{"argument to exchanges", withToken, []string{"exchanges", "orders"}, exitUsage, `unexpected argument "orders"`},
		{"unknown flag", withToken, []string{"exchanges", "--colour"}, exitUsage, "-colour"},
		{"no --vhost on upcoming", withToken, []string{"upcoming", "--vhost", "/"}, exitUsage, "-vhost"},
		{"cancel without a choice", withToken, []string{"messages", "cancel", ex}, exitUsage, "exactly one of --message-id, --key and --all"},
		{"cancel with two", withToken, []string{"messages", "cancel", ex, "--key", "00", "--all"}, exitUsage, "exactly one"},
		{"--yes without --all", withToken, []string{"messages", "cancel", ex, "--message-id", "a", "--yes"}, exitUsage, "--yes goes with --all"},
		{"bad key", withToken, []string{"messages", "cancel", ex, "--key", "zz"}, exitUsage, "hex digits"},
		{"bad --after", withToken, []string{"messages", "list", ex, "--after", "zz"}, exitUsage, "hex digits"},
		{"negative --limit", withToken, []string{"messages", "list", ex, "--limit", "-1"}, exitUsage, "--limit -1"},
		{"bad --server", withToken, []string{"exchanges", "--server", "ftp://x"}, exitUsage, "--server"},
		{"messages alone", withToken, []string{"messages"}, exitUsage, "messages list EXCHANGE"},
		{"unknown subcommand", withToken, []string{"messages", "purge"}, exitUsage, `unknown command "purge"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := p.cli(t, tt.env, nil, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", r.code, tt.code, r.stderr)
			}
			if !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("stderr %q lacks %q", r.stderr, tt.stderr)
			}
			if tt.code != exitOK && r.stdout != "" {
				t.Errorf("stdout on failure: %q", r.stdout)
			}
		})
	}
	if r := p.cli(t, withToken, nil, "messages", "count", ex); tableRows(r.stdout)[1][2] != "1" {
		t.Errorf("the failures changed the store:\n%s", r.stdout)
	}
}

func TestCLIHelp(t *testing.T) {
	for _, c := range cliCommands {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			args := append(strings.Fields(c.name), "--help")
			code := runCLI(args, cliIO{getenv: func(string) string { return "" }, now: time.Now, stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr})
			if code != 0 || stderr.Len() > 0 {
				t.Errorf("exit %d, stderr %q", code, stderr.String())
			}
			for _, want := range []string{"Usage: delayproxy " + c.name, "--server ADDR", "--json", "Exit status:", "6  a cancel matched no pending message"} {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("help lacks %q:\n%s", want, stdout.String())
				}
			}
		})
	}
	var stdout strings.Builder
	if code := runCLI([]string{"messages", "--help"}, cliIO{stdout: &stdout}); code != 0 || !strings.Contains(stdout.String(), "delayproxy messages cancel EXCHANGE") {
		t.Errorf("messages --help: exit %d, %q", code, stdout.String())
	}
}

// TestCLIBinary runs one operator command through the real binary: main
// dispatches it and exits with its status.
func TestCLIBinary(t *testing.T) {
	p := startCLIProxy(t)
	cmd, stdout, stderr := command(t, map[string]string{"DELAYPROXY_HTTP_ADDR": p.httpAddr}, "upcoming")
	if code := exitCode(cmd.Run()); code != exitUnauthorized || stdout.Len() > 0 || !strings.Contains(stderr.String(), "wants the admin token") {
		t.Errorf("without a token: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	cmd, stdout, stderr = command(t, map[string]string{"DELAYPROXY_HTTP_ADDR": p.httpAddr, "DELAYPROXY_ADMIN_TOKEN": cliToken}, "upcoming")
	if code := exitCode(cmd.Run()); code != 0 || !strings.Contains(stdout.String(), "total") {
		t.Errorf("with the token: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestCLIDeliveryTime: the default exchange holding a message published
// with x-opt-delivery-delay shows as "(default)" of type
// "(delivery-time)", and is counted and cancelled by its API name
// amq.default.
func TestCLIDeliveryTime(t *testing.T) {
	p := startCLIProxy(t)
	conn := testbroker.Dial(t, p.amqpURL)
	ch := testbroker.Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "nowhere", false, false, amqp.Publishing{
		Headers: amqp.Table{"x-opt-delivery-delay": int32(3_600_000)}, MessageId: "dt", Body: []byte("dt")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("not confirmed: %v", err)
	}
	r := p.cli(t, withToken, nil, "exchanges")
	rows := tableRows(r.stdout)
	if r.code != 0 || len(rows) != 2 || !reflect.DeepEqual(rows[1][:4], []string{"/", "(default)", "(delivery-time)", "1"}) {
		t.Fatalf("exchanges: exit %d\n%s", r.code, r.stdout)
	}
	if r := p.cli(t, withToken, nil, "messages", "count", "amq.default"); r.code != 0 || tableRows(r.stdout)[1][2] != "1" {
		t.Fatalf("messages count amq.default: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := p.cli(t, withToken, nil, "messages", "cancel", "amq.default", "--message-id", "dt"); r.code != 0 {
		t.Fatalf("messages cancel: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := p.cli(t, withToken, nil, "messages", "count", "amq.default"); r.code != 0 || tableRows(r.stdout)[1][2] != "0" {
		t.Fatalf("after cancel: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
