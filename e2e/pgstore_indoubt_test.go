package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy"
	"github.com/delayproxy/delayproxy/internal/testbroker"
	"github.com/delayproxy/delayproxy/internal/testwait"
)

// TestPGStore_CommitInDoubt: the connection of a commit breaks after
// PostgreSQL committed it locally (its session is terminated while the
// commit waits for a synchronous standby that never comes). The message is
// stored, so the publish is confirmed, not nacked, and it is released.
func TestPGStore_CommitInDoubt(t *testing.T) {
	pg := newPGServer(t)
	b := testbroker.Default(t)
	tp := startProxyOn(t, b, func(c *delayproxy.Config) { c.Store = pg.URL() })
	ch := confirmChannel(t, tp.dial(t))
	ex, _, cons := delayedFanoutOn(t, b, ch)
	// The store takes message sequences in blocks: the first publish takes
	// one, so that the next one's only commit is its insert.
	publishConfirmed(t, ch, ex, "", false, delayedMsg(int64(1000), "first"))

	pg.conf("synchronous_standby_names = 'nobody'") // every commit waits
	pg.reload()
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, "", false, false, delayedMsg(int64(1000), "in-doubt"))
	if err != nil {
		t.Fatal(err)
	}
	const waiting = "FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query NOT LIKE '%releaser_lease%'"
	testwait.Until(t, 10*time.Second, "the commit to wait for the standby", func() bool {
		out, _ := pg.psql("SELECT count(*) " + waiting)
		return strings.TrimSpace(out) != "0"
	})
	if out, err := pg.psql("SELECT pg_terminate_backend(pid) " + waiting); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	pg.conf("synchronous_standby_names = ''")
	pg.reload()
	select {
	case <-dc.Done():
	case <-time.After(40 * time.Second):
		t.Fatal("no answer to the publish")
	}
	if !dc.Acked() {
		t.Fatal("nacked, though PostgreSQL committed it")
	}
	cons.waitByID(t, 2, 30*time.Second)
}
