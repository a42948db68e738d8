package e2e

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// amqp-tools in the client suite: rabbitmq-c's command-line programs, run
// by the test itself. amqp-publish sends basic.publish and channel.close
// in one write, so a refusal of the publish must come back instead of
// channel.close-ok.

// toolRun is one amqp-tools command's outcome.
type toolRun struct {
	stdout, stderr string
	exit           int
}

// runTool runs an amqp-tools command for at most 60 s; exit is -1 when it
// did not start or was killed.
func runTool(argv ...string) toolRun {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := toolRun{stdout: strings.TrimSpace(stdout.String()), stderr: strings.TrimSpace(stderr.String())}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.exit = ee.ExitCode()
	case err != nil:
		r.exit, r.stderr = -1, err.Error()
	}
	return r
}

// amqpToolsChecks runs the amqp-tools checks and returns their lines:
// tools_roundtrip and tools_404 on RabbitMQ and the proxy, tools_refused
// on the proxy.
func amqpToolsChecks(t *testing.T, ct *clientTargets, prefix string) map[resultKey]clientLine {
	t.Helper()
	lines := map[resultKey]clientLine{}
	report := func(check, target string, result map[string]any) {
		lines[resultKey{check, target}] = clientLine{Check: check, Target: target, Result: clientJSONMap(result)}
	}
	for _, target := range clientDirectAndProxy {
		u := "--url=" + ct.url(target)
		q := prefix + "." + target + ".tq"
		declared := runTool("amqp-declare-queue", u, "-q", q)
		published := runTool("amqp-publish", u, "-r", q, "-b", "tools body")
		got := runTool("amqp-get", u, "-q", q)
		republished := runTool("amqp-publish", u, "-r", q, "-b", "tools body")
		consumed := runTool("amqp-consume", u, "-q", q, "-c", "1", "cat")
		deleted := runTool("amqp-delete-queue", u, "-q", q)
		exit := 0
		var stderr []string
		for _, r := range []toolRun{declared, published, got, republished, consumed, deleted} {
			exit = max(exit, r.exit)
			if r.stderr != "" {
				stderr = append(stderr, r.stderr)
			}
		}
		report("tools_roundtrip", target, map[string]any{"declared": declared.stdout, "got": got.stdout,
			"consumed": consumed.stdout, "exit": exit, "stderr": strings.Join(stderr, "\n")})

		missing := runTool("amqp-publish", u, "-e", prefix+"."+target+".missing", "-r", "k", "-b", "m")
		report("tools_404", target, map[string]any{"exit": missing.exit, "stderr": missing.stderr})
	}

	x := prefix + "." + targetProxy + ".tdx"
	err := goDeclareDelayed(ct.url(targetProxy), x)
	if err != nil {
		lines[resultKey{"tools_refused", targetProxy}] = clientLine{Check: "tools_refused", Target: targetProxy,
			Error: "declare the delayed exchange: " + err.Error()}
		return lines
	}
	// The refusal races the channel.close behind it: try a few times,
	// report the first run that was not refused (or the last).
	var refused toolRun
	for range 5 {
		refused = runTool("amqp-publish", "--url="+ct.url(targetProxy), "-e", x, "-r", "k", "-H", "x-delay: abc", "-b", "m")
		if refused.exit == 0 {
			break
		}
	}
	report("tools_refused", targetProxy, map[string]any{"exit": refused.exit, "stderr": refused.stderr})
	// Through the proxy, so that it forgets the delayed exchange too.
	testbroker.WithChannel(t, ct.url(targetProxy), func(ch *amqp.Channel) error { return ch.ExchangeDelete(x, false, false) })
	return lines
}

// goDeclareDelayed declares a delayed direct exchange through the proxy at
// u.
func goDeclareDelayed(u, name string) error {
	c, err := amqp.Dial(u)
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	return ch.ExchangeDeclare(name, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "direct"})
}

// clientJSONMap is m as a client program's line carries it: through JSON.
func clientJSONMap(m map[string]any) map[string]any {
	out, _ := clientNormalized(m, "", "").(map[string]any)
	return out
}
