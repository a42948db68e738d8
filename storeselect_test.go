package delayproxy

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/metrics"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// heardKeys records what a node's scheduler hears of other nodes.
type heardKeys struct {
	mu                   sync.Mutex // guards announced and cancelled
	announced, cancelled []store.Key
}

func (h *heardKeys) AnnouncedIn(anns []pgstore.Announced) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range anns {
		h.announced = append(h.announced, a.Key)
	}
}

func (h *heardKeys) Cancelled(keys ...store.Key) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cancelled = append(h.cancelled, keys...)
}

func (h *heardKeys) Rescan() {}

func (h *heardKeys) has(k store.Key) (announced, cancelled bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.announced, k), slices.Contains(h.cancelled, k)
}

// In cluster mode, the messages another node stores due soon reach this
// node's scheduler (Announced), and so do its cancels of them (Cancelled:
// the releasing node may have read them ahead).
func TestClusterStoreTellsTheSchedulerOfOtherNodes(t *testing.T) {
	schema := teststore.PGSchema(t)
	p := &Proxy{cfg: Config{Store: teststore.PGURL(), StoreSchema: schema}, log: slog.New(slog.DiscardHandler)}
	ann := &lateAnnouncer{}
	heard := &heardKeys{}
	ann.set(heard)
	st, err := p.openStore(context.Background(), metrics.New(), ann)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	other := teststore.OpenPG(t, schema, pgstore.Options{})
	storetest.Exchange(t, other, "/", "dx")
	m := storetest.Message("dx", time.Now().Add(time.Second).UnixMilli(), 0, "soon")
	m.MessageID = "m-1"
	storetest.Put(t, other, m)
	testwait.Until(t, 10*time.Second, "the announcement", func() bool { a, _ := heard.has(m.Key); return a })
	if _, err := other.Cancel(context.Background(), "/", "dx", "m-1"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the cancel", func() bool { _, c := heard.has(m.Key); return c })
}
