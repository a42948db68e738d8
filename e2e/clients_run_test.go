package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// The client suite's machinery: the brokers it runs on, the targets a
// client program is given, running a program and reading its lines.

// clientBroker is one RabbitMQ the suite runs against.
type clientBroker struct {
	name string // "RabbitMQ-3.10.8", from its connection.start
	url  string
}

// clientBrokers are RabbitMQ at AMQP_URL and at AMQP_URL_43, each named by
// the version it announces; the test fails when either is unreachable.
func clientBrokers(t *testing.T) []clientBroker {
	t.Helper()
	var out []clientBroker
	for _, b := range testbroker.Brokers(t) {
		u := b.URL
		c, err := amqp.Dial(u)
		if err != nil {
			t.Fatalf("RabbitMQ %s at %s: %v", b.Name, clientRedacted(u), err)
		}
		name := fmt.Sprintf("%v-%v", c.Properties["product"], c.Properties["version"])
		c.Close()
		out = append(out, clientBroker{name: name, url: u})
	}
	return out
}

// redactURL is u without its password, for messages.
func clientRedacted(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return pu.Redacted()
}

// Targets a client program talks to.
const (
	targetDirect  = "direct"  // RabbitMQ itself
	targetProxy   = "proxy"   // a proxy with --released-delay-type int64
	targetProxy32 = "proxy32" // a proxy with --released-delay-type int32
)

// clientTargets are one broker and the two proxies in front of it.
type clientTargets struct {
	broker         clientBroker
	user, password string
	addrs          map[string]string // target -> host:port
}

// startClientTargets starts the two proxies in front of b, stopped in
// t.Cleanup.
func startClientTargets(t *testing.T, b clientBroker) *clientTargets {
	t.Helper()
	bu, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := bu.User.Password()
	ct := &clientTargets{broker: b, user: bu.User.Username(), password: pw,
		addrs: map[string]string{targetDirect: bu.Host}}
	for target, delayType := range map[string]string{targetProxy: "int64", targetProxy32: "int32"} {
		tp := startProxy(t, func(c *delayproxy.Config) {
			c.UpstreamURL = b.url
			c.ReleasedDelayType = delayType
		})
		pu, err := url.Parse(tp.URL())
		if err != nil {
			t.Fatal(err)
		}
		ct.addrs[target] = pu.Host
	}
	return ct
}

// url is target's AMQP URL with the broker's credentials and vhost "/",
// written %2f (bunny, rabbitmq-c and the Java client read a bare "/" as the
// vhost "").
func (ct *clientTargets) url(target string) string {
	return "amqp://" + url.UserPassword(ct.user, ct.password).String() + "@" + ct.addrs[target] + "/%2f"
}

// env is what a client program reads: the targets' addresses, the
// credentials and the prefix of every name it declares.
func (ct *clientTargets) env(prefix string) []string {
	return []string{
		"CLIENT_USER=" + ct.user,
		"CLIENT_PASSWORD=" + ct.password,
		"CLIENT_PREFIX=" + prefix,
		"CLIENT_DIRECT_ADDR=" + ct.addrs[targetDirect],
		"CLIENT_PROXY_ADDR=" + ct.addrs[targetProxy],
		"CLIENT_PROXY32_ADDR=" + ct.addrs[targetProxy32],
	}
}

// resultKey names one line of a client program: a check on a target.
type resultKey struct{ check, target string }

// clientLine is one line a client program prints.
type clientLine struct {
	Check  string         `json:"check"`
	Target string         `json:"target"`
	Result map[string]any `json:"result"`
	Error  string         `json:"error"`
}

// clientOutput is what one run of a client program reported.
type clientOutput struct {
	lines map[resultKey]clientLine
	log   string // its standard error, and any line that was not a check's
}

// clientTimeout bounds one run of a client program.
const clientTimeout = 150 * time.Second

// clientSlots bounds the client programs running at once: the machine's
// cores are few, and a starved client reports late arrivals, not defects.
var clientSlots = make(chan struct{}, 4)

// runClientProgram runs argv (in e2e/testdata/clients) with the targets'
// environment and reads its lines; it fails the test if the program cannot
// start or exits with an error.
func runClientProgram(t *testing.T, ct *clientTargets, prefix string, argv []string) clientOutput {
	t.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		t.Fatalf("client program %s is not installed (`bash .ci/clients` installs the clients): %v", argv[0], err)
	}
	dir, err := filepath.Abs(filepath.Join("testdata", "clients"))
	if err != nil {
		t.Fatal(err)
	}
	clientSlots <- struct{}{}
	defer func() { <-clientSlots }()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	// No __pycache__ in the source tree.
	cmd.Env = append(append(os.Environ(), ct.env(prefix)...), "PYTHONDONTWRITEBYTECODE=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	runErr := cmd.Run()
	out := parseClientLines(t, stdout.Bytes())
	out.log += stderr.String()
	if runErr != nil {
		t.Errorf("%s: %v after %v\n%s", strings.Join(argv, " "), runErr, time.Since(start).Round(time.Millisecond), out.log)
	}
	return out
}

// parseClientLines reads a program's standard output: one JSON line per
// check and target.
func parseClientLines(t *testing.T, b []byte) clientOutput {
	t.Helper()
	out := clientOutput{lines: map[resultKey]clientLine{}}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l clientLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Check == "" {
			out.log += sc.Text() + "\n"
			continue
		}
		k := resultKey{l.Check, l.Target}
		if _, dup := out.lines[k]; dup {
			t.Errorf("check %s on %s reported twice", l.Check, l.Target)
		}
		out.lines[k] = l
	}
	return out
}

// cleanupClientNames deletes, straight on the broker, the exchanges and
// queues with fixed names that a client program declares under prefix
// (the others are exclusive), for a program that failed before its own
// cleanup.
func cleanupClientNames(t *testing.T, ct *clientTargets, prefix string) {
	t.Helper()
	c, err := amqp.Dial(ct.broker.url)
	if err != nil {
		t.Errorf("cleanup: dial %s: %v", clientRedacted(ct.broker.url), err)
		return
	}
	defer c.Close()
	for _, target := range []string{targetDirect, targetProxy, targetProxy32} {
		for _, n := range clientFixedNames {
			ch, err := c.Channel()
			if err != nil {
				t.Errorf("cleanup: %v", err)
				return
			}
			name := prefix + "." + target + "." + n.suffix
			if n.queue {
				_, err = ch.QueueDelete(name, false, false, false)
			} else {
				err = ch.ExchangeDelete(name, false, false)
			}
			if err != nil {
				t.Errorf("cleanup: delete %s: %v", name, err)
			}
			ch.Close()
		}
	}
}

// clientFixedNames are the suffixes of the names a client program gives the
// exchanges and queues that outlive its connections.
var clientFixedNames = []struct {
	suffix string
	queue  bool
}{
	{"dx", false},  // the delayed direct exchange
	{"dt", false},  // the delayed topic exchange
	{"px", false},  // a plain exchange, redeclared with another type
	{"qq", true},   // the quorum queue
	{"cq", true},   // Celery's queue
	{"cx", false},  // Celery's exchange
	{"tq", true},   // amqp-tools' queue
	{"tdx", false}, // amqp-tools' delayed exchange
}
