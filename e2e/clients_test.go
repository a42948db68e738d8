package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The client suite: ten real AMQP clients, each as its users would write
// it, against RabbitMQ 3.10 and 4.3, through the proxy and straight to
// RabbitMQ.
//
// Each client but amqp091-go (clients_go_test) is a program of its own
// under testdata/clients, run once per broker. It reads its targets from
// the environment (clientTargets.env: CLIENT_DIRECT_ADDR, CLIENT_PROXY_ADDR
// for the proxy with --released-delay-type int64, CLIENT_PROXY32_ADDR for
// int32, CLIENT_USER, CLIENT_PASSWORD, CLIENT_PREFIX), names whatever it
// declares CLIENT_PREFIX.<target>.<suffix>, and prints one JSON line per
// check and target:
//
//	{"check": "get", "target": "proxy", "result": {"body": "hello", ...}}
//	{"check": "get", "target": "proxy", "error": "what went wrong"}
//
// The test judges each line (clientChecks): delayed checks against what
// the proxy promises and how that client decodes the released x-delay,
// every other check against the same client's result straight to
// RabbitMQ.

// clientSpec is one client of the suite.
type clientSpec struct {
	name     string
	checks   []string         // names in clientChecks
	released releasedDecoding // how it reads a released x-delay
	// inexpressible are checks whose expected result the client cannot
	// show (why): they are compared with RabbitMQ's own answer only.
	inexpressible map[string]string
	// run runs the client's checks on ct, naming what it declares
	// prefix.<target>.<suffix>.
	run func(t *testing.T, ct *clientTargets, prefix string, b *clientBuilds) clientOutput
}

// clientPython is the interpreter the Debian clients load under, whatever
// python3 comes first on PATH.
const clientPython = "/usr/bin/python3"

// clientCommand runs a client program with argv (relative paths in
// testdata/clients).
func clientCommand(argv ...string) func(*testing.T, *clientTargets, string, *clientBuilds) clientOutput {
	return func(t *testing.T, ct *clientTargets, prefix string, _ *clientBuilds) clientOutput {
		t.Helper()
		return runClientProgram(t, ct, prefix, argv)
	}
}

// suiteClients are the ten clients.
var suiteClients = []clientSpec{
	{name: "amqp091-go", checks: clientGenericChecks,
		released: releasedDecoding{releasedSigned("int64"), releasedSigned("int32")},
		run:      runGoClient},
	{name: "pika", checks: append(slices.Clone(clientGenericChecks), "delivery_time"),
		released: releasedDecoding{releasedUnsigned(64, "long"), releasedSigned("int")},
		run:      clientCommand(clientPython, "python/pika_checks.py")},
	{name: "py-amqp", checks: clientGenericChecks,
		released: releasedDecoding{releasedUnsigned(64, "int"), releasedSigned("int")},
		run:      clientCommand(clientPython, "python/pyamqp_checks.py")},
	{name: "kombu", checks: clientGenericChecks,
		released: releasedDecoding{releasedUnsigned(64, "int"), releasedSigned("int")},
		run:      clientCommand(clientPython, "python/kombu_checks.py")},
	{name: "celery", checks: []string{"server", "celery_task", "celery_countdown"},
		released: releasedDecoding{releasedUnsigned(64, "int"), releasedSigned("int")},
		run:      clientCommand(clientPython, "python/celery_checks.py")},
	{name: "amqplib", checks: clientWithout(clientGenericChecks, "tx", "tx_delayed"), // amqplib has no transactions
		released: releasedDecoding{releasedSigned("number"), releasedSigned("number")},
		inexpressible: map[string]string{
			"error_530": "amqplib reports a refused connection.open as \"Expected ConnectionOpenOk; got <ConnectionClose channel:0>\"",
		},
		run: clientCommand("node", "node/checks.js")},
	{name: "php-amqplib", checks: clientGenericChecks,
		released: releasedDecoding{releasedSigned("integer"), releasedSigned("integer")},
		run:      clientCommand("php", "php/checks.php")},
	{name: "bunny", checks: clientGenericChecks,
		released: releasedDecoding{releasedSigned("Integer"), releasedUnsigned(32, "Integer")},
		run:      clientCommand("ruby", "ruby/checks.rb")},
	{name: "java", checks: clientGenericChecks,
		released: releasedDecoding{releasedSigned("Long"), releasedSigned("Integer")},
		run:      runJavaClient},
	{name: "rabbitmq-c", checks: append(slices.Clone(clientGenericChecks), "tools_roundtrip", "tools_404", "tools_refused"),
		released: releasedDecoding{releasedSigned("int64_t"), releasedSigned("int32_t")},
		run:      runRabbitmqC},
}

// clientWithout is checks without the names given.
func clientWithout(checks []string, names ...string) []string {
	return slices.DeleteFunc(slices.Clone(checks), func(c string) bool { return slices.Contains(names, c) })
}

// TestClients runs every client's checks on each broker, through proxies
// with either --released-delay-type, and logs a table of the results.
func TestClients(t *testing.T) {
	t.Parallel()
	builds := buildClients(t)
	report := &clientReport{}
	t.Cleanup(func() { t.Log("client suite results:\n" + report.String()) })
	for _, b := range clientBrokers(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ct := startClientTargets(t, b)
			for i := range suiteClients {
				c := &suiteClients[i]
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					prefix := "dp-test.clients." + c.name + "." + randHex(t, 4)
					t.Cleanup(func() { cleanupClientNames(t, ct, prefix) })
					out := c.run(t, ct, prefix, builds)
					judgeClient(t, c, b.name, prefix, out, report)
				})
			}
		})
	}
}

// judgeClient judges each of c's checks in a subtest of its own, and
// fails on lines no check expects.
func judgeClient(t *testing.T, c *clientSpec, broker, prefix string, out clientOutput, report *clientReport) {
	t.Helper()
	expected := map[resultKey]bool{}
	unexplained := false // a problem no known defect explains
	for _, name := range c.checks {
		chk, ok := clientChecks[name]
		if !ok {
			t.Fatalf("client %s lists check %q, which the suite does not have", c.name, name)
		}
		cr := &clientCheckRun{name: name, client: c, prefix: prefix, lines: map[string]clientLine{}}
		for _, target := range chk.targets {
			k := resultKey{name, target}
			expected[k] = true
			if l, ok := out.lines[k]; ok {
				cr.lines[target] = l
			}
		}
		problems := chk.judge(cr)
		report.add(c.name, broker, name, problems)
		for _, p := range problems {
			unexplained = unexplained || p.defect == ""
		}
		t.Run(name, func(t *testing.T) {
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
	for k, l := range out.lines {
		if !expected[k] {
			t.Errorf("unexpected line %+v", l)
			unexplained = true
		}
	}
	if unexplained && out.log != "" {
		t.Logf("%s's standard error:\n%s", c.name, out.log)
	}
}

// clientReport collects each check's outcome for the table TestClients
// logs.
type clientReport struct {
	mu   sync.Mutex // guards rows
	rows []clientReportRow
}

type clientReportRow struct {
	client, broker, check string
	problems              []clientProblem
}

func (r *clientReport) add(client, broker, check string, problems []clientProblem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, clientReportRow{client, broker, check, problems})
}

// String is one line per client and broker: how many checks passed, and
// each failed one with the defects it shows.
func (r *clientReport) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type key struct{ client, broker string }
	var keys []key
	byKey := map[key][]clientReportRow{}
	for _, row := range r.rows {
		k := key{row.client, row.broker}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], row)
	}
	slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.client+" "+a.broker, b.client+" "+b.broker) })
	var sb strings.Builder
	for _, k := range keys {
		rows := byKey[k]
		passed := 0
		var failed []string
		for _, row := range rows {
			if len(row.problems) == 0 {
				passed++
				continue
			}
			var defects []string
			for _, p := range row.problems {
				d := "unexplained"
				if p.defect != "" {
					d, _, _ = strings.Cut(strings.TrimPrefix(p.defect, "issue 13 "), " (")
				}
				if !slices.Contains(defects, d) {
					defects = append(defects, d)
				}
			}
			failed = append(failed, fmt.Sprintf("%s (%s)", row.check, strings.Join(defects, ", ")))
		}
		fmt.Fprintf(&sb, "%-12s %-16s %2d/%d passed", k.client, k.broker, passed, len(rows))
		if len(failed) > 0 {
			fmt.Fprintf(&sb, "; failed: %s", strings.Join(failed, "; "))
		}
		sb.WriteString("\n")
	}
	return sb.String()
}
