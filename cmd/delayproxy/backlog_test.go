package main

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/delayproxy/delayproxy/internal/testbroker"
)

// TestOverdueGaugeUnderABacklog runs delayproxy with --release-rate 100 and
// publishes 1200 messages due at the same instant: they take 12 s to
// release. The overdue gauges rise and fall back to 0, and the log tells
// the progress: behind, catching up (remaining, rate, time left), caught up.
func TestOverdueGaugeUnderABacklog(t *testing.T) {
	const n = 1200
	p := startChild(t, t.TempDir(), map[string]string{"DELAYPROXY_RELEASE_RATE": "100"})
	scraper := &cliProxy{httpAddr: p.httpAddr}

	ex := testbroker.UniqueName(t, "backlog")
	ch := testbroker.Channel(t, testbroker.Dial(t, p.url(t)))
	t.Cleanup(func() { testbroker.DeleteExchange(t, ex) })
	if err := ch.ExchangeDeclare(ex, "x-delayed-message", true, false, false, false, amqp.Table{"x-delayed-type": "direct"}); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "rk", ex, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	due := time.Now().Add(3 * time.Second) // time to publish them all, even on a busy machine
	var confirms []*amqp.DeferredConfirmation
	for i := range n {
		// All due at the same instant, whenever each is published.
		delay := time.Until(due).Milliseconds()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, ex, "rk", false, false, amqp.Publishing{
			Headers: amqp.Table{"x-delay": max(delay, 1)}, Body: []byte{byte(i)},
		})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}

	// The gauges while it drains, and after.
	var most, oldest float64
	for {
		m := scraper.scrape(t)
		most = max(most, m["delayproxy_overdue_messages"])
		oldest = max(oldest, m["delayproxy_oldest_overdue_seconds"])
		if m["delayproxy_messages_released_total"] == n && m["delayproxy_overdue_messages"] == 0 {
			if m["delayproxy_oldest_overdue_seconds"] != 0 {
				t.Errorf("caught up, yet delayproxy_oldest_overdue_seconds = %v", m["delayproxy_oldest_overdue_seconds"])
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("not drained: released %v, overdue %v", m["delayproxy_messages_released_total"], m["delayproxy_overdue_messages"])
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Measured once a second while 100 a second go out: near the start
	// more than 1000 are overdue; the last ones wait about 12 s.
	if most < 900 || most > n {
		t.Errorf("delayproxy_overdue_messages peaked at %v, want about %d", most, n)
	}
	if oldest < 8 || oldest > 20 {
		t.Errorf("delayproxy_oldest_overdue_seconds peaked at %v, want about 12", oldest)
	}

	// The progress lines.
	p.waitLog(t, "scheduler: releases caught up", 10*time.Second)
	lines := map[string][]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(p.Log()))
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && strings.HasPrefix(rec["msg"].(string), "scheduler: releases ") {
			lines[rec["msg"].(string)] = append(lines[rec["msg"].(string)], rec)
			t.Logf("%s", sc.Bytes())
		}
	}
	behind, progress, caughtUp := lines["scheduler: releases behind, catching up"], lines["scheduler: releases catching up"], lines["scheduler: releases caught up"]
	if len(behind) != 1 || len(caughtUp) != 1 || len(progress) == 0 {
		t.Fatalf("progress lines: %d behind, %d catching up, %d caught up; want 1, some, 1: %v", len(behind), len(progress), len(caughtUp), lines)
	}
	for _, rec := range progress {
		for _, k := range []string{"released", "remaining", "rate_per_s", "eta", "oldest_late"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("progress line without %s: %v", k, rec)
			}
		}
		if r := rec["rate_per_s"].(float64); r < 50 || r > 150 {
			t.Errorf("progress rate %v/s, want about 100: %v", r, rec)
		}
	}
	if r := caughtUp[0]["released"].(float64); r < 600 || r > n {
		t.Errorf("caught up after releasing %v, want most of %d: %v", r, n, caughtUp[0])
	}

	// Every message arrived.
	got := 0
	for got < n && ctx.Err() == nil {
		if _, ok, err := ch.Get(q.Name, true); err != nil {
			t.Fatal(err)
		} else if ok {
			got++
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got != n {
		t.Errorf("%d of %d messages arrived", got, n)
	}
}
