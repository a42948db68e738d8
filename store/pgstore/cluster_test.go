package pgstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store"
	"github.com/delayproxy/delayproxy/store/pgstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// heard collects the keys a store announced to OnNotify.
type heard struct {
	mu   sync.Mutex // guards keys, parts and at
	keys []store.Key
	part []int
	at   []time.Time
}

func (h *heard) notify(keys []pgstore.Announced) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range keys {
		h.keys = append(h.keys, a.Key)
		h.part = append(h.part, a.Partition)
		h.at = append(h.at, time.Now())
	}
}

// cancelled collects keys as OnCancel hears them: partition -1.
func (h *heard) cancelled(keys []store.Key) {
	anns := make([]pgstore.Announced, len(keys))
	for i, k := range keys {
		anns[i] = pgstore.Announced{Key: k, Partition: -1}
	}
	h.notify(anns)
}

// has reports whether k was heard, when, and in which partition.
func (h *heard) has(k store.Key) (time.Time, int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i := slices.Index(h.keys, k); i >= 0 {
		return h.at[i], h.part[i], true
	}
	return time.Time{}, 0, false
}

// TestTwoNodes: two stores on one schema, as two proxies: each sees the
// other's registry changes, messages, counts and cancels, and hears of the
// other's messages due soon.
func TestTwoNodes(t *testing.T) {
	ctx := context.Background()
	schema := teststore.PGSchema(t)
	var hb, hbCancel heard
	a := teststore.OpenPG(t, schema, pgstore.Options{})
	b := teststore.OpenPG(t, schema, pgstore.Options{OnNotify: hb.notify, OnCancel: hbCancel.cancelled, NotifyWithin: time.Minute})
	now := time.Now().UnixMilli()

	x := storetest.Exchange(t, a, "/", "x")
	testwait.Until(t, 10*time.Second, "b learns of x", func() bool { d, ok := b.Exchange("/", "x"); return ok && d.Incarnation == x.Incarnation })

	soon, later := storetest.Message("x", now+5_000, 0, "soon"), storetest.Message("x", now+time.Hour.Milliseconds(), 0, "later")
	soon.MessageID = "id-soon"
	storetest.Put(t, a, soon, later)
	put := time.Now()
	testwait.Until(t, 10*time.Second, "b hears of the message due soon", func() bool { _, ok := b.Exchange("/", "x"); _, _, heard := hb.has(soon.Key); return ok && heard })
	at, part, _ := hb.has(soon.Key)
	t.Logf("announced to the other node %v after Put returned", at.Sub(put))
	if want := pgstore.PartitionOf(x.Incarnation); part != want {
		t.Errorf("announced in partition %d, want %d", part, want)
	}
	if _, _, ok := hb.has(later.Key); ok {
		t.Error("b heard of a message due beyond NotifyWithin")
	}
	if got := storetest.Bodies(t, b, []store.Key{soon.Key, later.Key}); !slices.Equal(got, []string{"soon", "later"}) {
		t.Fatalf("b reads %q", got)
	}
	if n, p := b.Count("/", "x"), b.Pending(); n != 2 || p != 2 {
		t.Fatalf("b counts %d for x, %d pending; want 2, 2", n, p)
	}

	// A cancel on a keeps b from reading (and so releasing) the message,
	// and b hears of it (it may have read the message ahead); not of the
	// one due beyond NotifyWithin.
	// (Notifications come in commit order: the later one's would come
	// first.)
	later.MessageID = "id-later"
	storetest.Put(t, a, later)
	if _, err := a.Cancel(ctx, "/", "x", "id-later"); err != nil {
		t.Fatal(err)
	}
	if keys, err := a.Cancel(ctx, "/", "x", "id-soon"); err != nil || !slices.Equal(keys, []store.Key{soon.Key}) {
		t.Fatalf("Cancel on a = %x, %v", keys, err)
	}
	if got := storetest.Bodies(t, b, []store.Key{soon.Key}); got[0] != "<nil>" {
		t.Fatalf("b still reads the message a cancelled: %q", got)
	}
	testwait.Until(t, 10*time.Second, "b hears of the cancel", func() bool { _, _, ok := hbCancel.has(soon.Key); return ok })
	if _, _, ok := hbCancel.has(later.Key); ok {
		t.Error("b heard of a cancel of a message due beyond NotifyWithin")
	}

	// CancelExchange on a makes later stale on b.
	if _, err := a.CancelExchange(ctx, "/", "x"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "b sees later stale", func() bool { return b.Stale(later) })
	if n := b.Count("/", "x"); n != 0 {
		t.Fatalf("b counts %d for x after CancelExchange, want 0", n)
	}

	// An exchange b has not heard of yet: Stale asks the database rather
	// than call a fresh message stale.
	y := storetest.Exchange(t, a, "/", "y")
	fresh := storetest.Message("y", now, 0, "fresh")
	fresh.Incarnation = y.Incarnation
	if b.Stale(fresh) {
		t.Fatal("b calls a message of an exchange created on a stale")
	}
	if err := b.Put(ctx, fresh); err != nil {
		t.Fatalf("b puts with a's new incarnation: %v", err)
	}

	// DeleteExchange on b; a forgets it.
	if _, err := b.DeleteExchange(ctx, "/", "y"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "a forgets y", func() bool { _, ok := a.Exchange("/", "y"); return !ok })
	if !a.Stale(fresh) {
		t.Fatal("a: a message of a deleted exchange is not stale")
	}
}
