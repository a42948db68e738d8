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
