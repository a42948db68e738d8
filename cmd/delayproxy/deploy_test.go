package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// deployFiles are the Grafana dashboard and the alerting rules; every
// delayproxy_* name they use must be a metric the proxy exports.
var deployFiles = []string{"../../deploy/grafana/delayproxy.json", "../../deploy/prometheus/alerts.yml"}

// stillWithoutFaults are metrics that exist but move only when something
// fails (a store commit, the releaser's connection to RabbitMQ), when the
// store file grows or when releases fall behind: the traffic below cannot
// move them.
var stillWithoutFaults = map[string]bool{
	"delayproxy_store_commit_failures_total": true,
	"delayproxy_upstream_reconnects_total":   true,
	"delayproxy_store_file_bytes":            true, // grows in steps of the bbolt file, not per message
	"delayproxy_overdue_messages":            true, // TestOverdueGaugeUnderABacklog moves it
}

// TestDeployMetricsExistAndMove scrapes a proxy before and under traffic
// that stores, releases, returns, refuses, discards and cancels messages,
// and checks each metric name of the dashboard and the alerting rules.
func TestDeployMetricsExistAndMove(t *testing.T) {
	used := map[string]bool{}
	name := regexp.MustCompile(`delayproxy_[a-z0-9_]*[a-z0-9]`)
	for _, f := range deployFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range name.FindAllString(string(b), -1) {
			used[n] = true
		}
	}
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in %v", len(used), deployFiles)
	}

	p := startCLIProxy(t)
	before := p.scrape(t)

	// Traffic: released to a queue, one returned as unroutable, one refused,
	// one discarded with its exchange, one cancelled.
	conn, err := amqp.Dial(p.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ex := p.declareAndPublish(t, delayedMsg{id: "cancel-me", delay: time.Hour}, delayedMsg{id: "keep", delay: time.Hour})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "bound", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	var msgs []delayedMsg
	for range 20 {
		msgs = append(msgs, delayedMsg{routingKey: "bound", body: "x", delay: 50 * time.Millisecond})
	}
	p.publish(t, ch, ex, msgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ch.PublishWithContext(ctx, ex, "nowhere", true, false, amqp.Publishing{
		Headers: amqp.Table{"x-delay": int64(50)}, Body: []byte("unroutable"),
	}); err != nil {
		t.Fatal(err)
	}
	refusing, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closed := refusing.NotifyClose(make(chan *amqp.Error, 1))
	_ = refusing.PublishWithContext(ctx, ex, "bound", false, false, amqp.Publishing{Headers: amqp.Table{"x-delay": "soon"}})
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("a publish with x-delay \"soon\" was not refused")
	}
	gone := p.declareAndPublish(t, delayedMsg{delay: time.Hour})
	if err := ch.ExchangeDelete(gone, false, false); err != nil {
		t.Fatal(err)
	}
	if r := p.cli(t, withToken, nil, "messages", "cancel", ex, "--message-id", "cancel-me"); r.code != 0 {
		t.Fatalf("cancel: %+v", r)
	}

	var after map[string]float64
	for {
		after = p.scrape(t)
		if after["delayproxy_messages_released_total"] >= 21 && after["delayproxy_messages_unroutable_total"] >= 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("releases not counted: released %v, unroutable %v",
				after["delayproxy_messages_released_total"], after["delayproxy_messages_unroutable_total"])
		}
		time.Sleep(50 * time.Millisecond)
	}

	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		series := n
		if _, ok := after[n]; !ok {
			series = n + "_count" // a histogram named by its family
		}
		v, ok := after[series]
		switch {
		case !ok:
			t.Errorf("%s is used in %v but not exported", n, deployFiles)
		case v == before[series] && !stillWithoutFaults[n]:
			t.Errorf("%s did not move under traffic: %v before, %v after", series, before[series], v)
		}
	}
}

// scrape reads /metrics and sums each series name over its labels.
func (p *cliProxy) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.IndexAny(line, "{ ")
		j := strings.LastIndexByte(line, ' ')
		if i <= 0 || j < i {
			t.Fatalf("unexpected exposition line %q", line)
		}
		v, err := strconv.ParseFloat(line[j+1:], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out[line[:i]] += v
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("empty /metrics")
	}
	return out
}
