package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// TestPGStore_DelayedPublish: with --store a PostgreSQL URL, delayed
// publishes are confirmed, kept in PostgreSQL across a restart of the
// proxy, and released on time, none early.
func TestPGStore_DelayedPublish(t *testing.T) {
	t.Parallel()
	b := testbroker.Default(t)
	schema := teststore.PGSchema(t)
	tp := startProxyOn(t, b, func(c *delayproxy.Config) { c.Store, c.StoreSchema = teststore.PGURL(), schema })
	ch := confirmChannel(t, tp.dial(t))
	ex, _, cons := delayedFanoutOn(t, b, ch)
	const n = 20
	sent := map[string]time.Time{}
	for i := range n {
		id := fmt.Sprint(i)
		sent[id] = time.Now()
		publishConfirmed(t, ch, ex, "", false, delayedMsg(int64(1500+i*10), id))
	}
	tp.restart() // the messages wait in PostgreSQL, not in the proxy
	got := cons.waitByID(t, n, 30*time.Second)
	for i := range n {
		id := fmt.Sprint(i)
		if a, ok := arrived(t, got, id); ok {
			if early := sent[id].Add(time.Duration(1500+i*10) * time.Millisecond).Sub(a.At); early > 0 {
				t.Errorf("message %s arrived %v early", id, early)
			}
		}
	}
	tp.stop()
	teststore.OpenPG(t, schema, pgstore.Options{}) // checked when the test ends: counts match the (no) rows
}

// TestPGStore_TwoNodesShareTheView: two proxies on one PostgreSQL schema.
// An exchange declared and messages published through one are counted,
// listed and cancelled through the other's admin API; a message cancelled
// there is released by neither node, the other arrives. (Without the
// releaser role both nodes release, so arrivals are counted at least
// once.)
func TestPGStore_TwoNodesShareTheView(t *testing.T) {
	t.Parallel()
	b := testbroker.Default(t)
	schema := teststore.PGSchema(t)
	cfg := func(c *delayproxy.Config) { c.Store, c.StoreSchema = teststore.PGURL(), schema }
	a, other := startProxyOn(t, b, cfg), startProxyOn(t, b, cfg)
	ch := confirmChannel(t, a.dial(t))
	ex, _, cons := delayedFanoutOn(t, b, ch)
	publishConfirmed(t, ch, ex, "", false, delayedMsg(int64(2000), "kept"))
	publishConfirmed(t, ch, ex, "", false, delayedMsg(int64(2000), "cancelled"))
	if n := other.pending(t, ex); n != 2 {
		t.Fatalf("the other node counts %d pending, want 2", n)
	}
	if list := other.listPending(t, ex); len(list) != 2 {
		t.Fatalf("the other node lists %d, want 2", len(list))
	}
	if n := cancel(t, other, exchangePath(ex)+"/messages/cancelled"); n != 1 {
		t.Fatalf("cancel through the other node = %d, want 1", n)
	}
	if n := a.pending(t, ex); n != 1 {
		t.Fatalf("the publishing node counts %d pending after the cancel, want 1", n)
	}
	got := cons.wait(t, 1, 20*time.Second)
	time.Sleep(3 * time.Second) // past the cancelled one's due time, and a rescan
	for _, a := range append(got, cons.snapshot()...) {
		if a.MessageId != "kept" {
			t.Fatalf("%q arrived", a.MessageId)
		}
	}
	a.stop()
	other.stop()
	teststore.OpenPG(t, schema, pgstore.Options{}) // checked when the test ends
}
