package admin

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/store"
)

func TestUpcoming(t *testing.T) {
	f := newFixture(t, testToken, nil)
	// The fixture's six messages are due 2 h after the minute, in next_day.
	minute := time.UnixMilli(f.due).Add(-2 * time.Hour).Truncate(time.Minute)
	now := minute.Add(10 * time.Second)
	f.srv.now = func() time.Time { return now }
	ctx := context.Background()
	def := store.ExchangeDef{VHost: "/", Name: "soon", DelayedType: "direct"}
	if err := f.st.PutExchange(ctx, &def); err != nil {
		t.Fatal(err)
	}
	var msgs []*store.Message
	for _, in := range []time.Duration{
		-10 * time.Minute,                  // overdue
		30 * time.Second, 40 * time.Second, // next_minute
		30 * time.Minute,    // next_hour
		4 * 24 * time.Hour,  // next_week
		30 * 24 * time.Hour, // later
	} {
		msgs = append(msgs, &store.Message{VHost: def.VHost, Exchange: def.Name, Incarnation: def.Incarnation, Body: []byte("x"), Due: minute.Add(in).UnixMilli(), Delay: 1})
	}
	if err := f.st.Put(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// A stale message (its exchange cancelled) counts until it is discarded.
	gone := store.ExchangeDef{VHost: "/", Name: "gone", DelayedType: "direct"}
	if err := f.st.PutExchange(ctx, &gone); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Put(ctx, &store.Message{VHost: "/", Exchange: "gone", Incarnation: gone.Incarnation, Body: []byte("x"), Due: minute.Add(time.Minute / 2).UnixMilli(), Delay: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.CancelExchange(ctx, "/", "gone"); err != nil {
		t.Fatal(err)
	}

	if code, body := f.do(t, "GET", "/api/upcoming", ""); code != 401 {
		t.Errorf("without the token: %d %s, want 401", code, body)
	}
	if code, body := f.do(t, "POST", "/api/upcoming", testToken); code != 405 {
		t.Errorf("POST: %d %s, want 405", code, body)
	}
	code, body := f.do(t, "GET", "/api/upcoming", testToken)
	var got Upcoming
	if err := json.Unmarshal(body, &got); code != 200 || err != nil {
		t.Fatalf("GET /api/upcoming = %d %s (%v)", code, body, err)
	}

	ms := func(d time.Duration) int64 { return minute.Add(d).UnixMilli() }
	want := []UpcomingRange{
		{Name: "overdue", UntilMs: ms(0), Count: 1},
		{Name: "next_minute", FromMs: ms(0), UntilMs: ms(time.Minute), Count: 3}, // two, and the stale one
		{Name: "next_hour", FromMs: ms(time.Minute), UntilMs: ms(time.Hour), Count: 1},
		{Name: "next_day", FromMs: ms(time.Hour), UntilMs: ms(24 * time.Hour), Count: 6},
		{Name: "next_week", FromMs: ms(24 * time.Hour), UntilMs: ms(7 * 24 * time.Hour), Count: 1},
		{Name: "later", FromMs: ms(7 * 24 * time.Hour), Count: 1},
	}
	if got.NowMs != now.UnixMilli() || got.Now != formatMs(now.UnixMilli()) {
		t.Errorf("now = %d %q, want %d", got.NowMs, got.Now, now.UnixMilli())
	}
	if got.Total != 13 || got.Total != f.st.Pending()+1 {
		t.Errorf("total = %d, want 13: 12 pending (store: %d) and one stale", got.Total, f.st.Pending())
	}
	if len(got.Ranges) != len(want) {
		t.Fatalf("ranges = %+v, want %d", got.Ranges, len(want))
	}
	for i, w := range want {
		g := got.Ranges[i]
		if g.Name != w.Name || g.FromMs != w.FromMs || g.UntilMs != w.UntilMs || g.Count != w.Count {
			t.Errorf("range %d = %+v, want %+v", i, g, w)
		}
		if (g.From == "") != (w.FromMs == 0) || (g.From != "" && g.From != formatMs(g.FromMs)) ||
			(g.Until == "") != (w.UntilMs == 0) || (g.Until != "" && g.Until != formatMs(g.UntilMs)) {
			t.Errorf("range %d times %q %q do not match %d %d", i, g.From, g.Until, g.FromMs, g.UntilMs)
		}
	}
}
