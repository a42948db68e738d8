package pgstore_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/internal/testwait"
	"github.com/delayproxy/delayproxy/store/pgstore"
	"github.com/delayproxy/delayproxy/store/storetest"
)

// TestFailedCommit: a commit PostgreSQL refuses fails every Put in it and
// stores nothing; once the cause is gone, Puts succeed again.
func TestFailedCommit(t *testing.T) {
	schema := teststore.PGSchema(t)
	s := teststore.OpenPG(t, schema, pgstore.Options{})
	d := storetest.Exchange(t, s, "/", "x")
	exec(t, "ALTER TABLE "+schema+".messages ADD CONSTRAINT refuse CHECK (false) NOT VALID")
	var wg sync.WaitGroup
	var stored atomic.Int64
	for i := range 32 {
		wg.Go(func() {
			m := storetest.Message("x", storetest.Base+int64(i), 0, fmt.Sprint(i))
			m.Incarnation = d.Incarnation
			if err := s.Put(context.Background(), m); err == nil {
				stored.Add(1)
			}
		})
	}
	wg.Wait()
	if n, p := stored.Load(), s.Pending(); n != 0 || p != 0 {
		t.Fatalf("%d Puts returned nil, %d pending, while every commit failed", n, p)
	}
	exec(t, "ALTER TABLE "+schema+".messages DROP CONSTRAINT refuse")
	storetest.Put(t, s, storetest.Message("x", storetest.Base, 0, "after"))
	if p := s.Pending(); p != 1 {
		t.Fatalf("Pending %d, want 1", p)
	}
}

// TestConnectionsKilled: when PostgreSQL ends every session of the store
// (a restart, a failover), writes fail or succeed but are never lost, the
// store reconnects, and the listener, once back, reports that it may have
// missed announcements (OnMissed) and hears new ones.
func TestConnectionsKilled(t *testing.T) {
	schema := teststore.PGSchema(t)
	var missed atomic.Int64
	var heard atomic.Int64
	app := "delayproxy-test-" + schema // a's sessions, by name
	u, err := url.Parse(teststore.PGURL())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	a, err := pgstore.Open(context.Background(), u.String(), pgstore.Options{Schema: schema, OnMissed: func() { missed.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	teststore.OpenPG(t, schema, pgstore.Options{OnNotify: func(keys []pgstore.Announced) { heard.Add(int64(len(keys))) }})
	d := storetest.Exchange(t, a, "/", "x")
	exec(t, fmt.Sprintf("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '%s'", app))
	testwait.Until(t, 20*time.Second, "the listener reconnects and reports it", func() bool { return missed.Load() > 0 })
	// The pool's dead connections fail a commit or two, then it reconnects.
	testwait.Until(t, 20*time.Second, "a Put succeeds again", func() bool {
		m := storetest.Message("x", time.Now().UnixMilli()+1000, 0, "again")
		m.Incarnation = d.Incarnation
		return a.Put(context.Background(), m) == nil
	})
	testwait.Until(t, 20*time.Second, "the other node hears of it", func() bool { return heard.Load() > 0 })
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}
