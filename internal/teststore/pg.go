package teststore

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/store/pgstore"
)

// PGURL is the PostgreSQL the tests use: $PG_URL, by default the local
// server with trust authentication.
func PGURL() string {
	if u := os.Getenv("PG_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres"
}

// schemas numbers the schemas of one test process.
var schemas atomic.Uint64

// PGSchema is a schema name no other test uses; the schema is dropped with
// everything in it when the test ends. It fails the test when PostgreSQL
// cannot be reached.
func PGSchema(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9, schemas.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, PGURL())
	if err != nil {
		t.Fatalf("teststore: PostgreSQL at PG_URL: %v", err)
	}
	_ = conn.Close(ctx)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, PGURL())
		if err != nil {
			t.Errorf("teststore: drop schema %s: %v", name, err)
			return
		}
		defer func() { _ = conn.Close(ctx) }()
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Errorf("teststore: drop schema %s: %v", name, err)
		}
	})
	return name
}

// OpenPG opens the PostgreSQL store in schema (PGSchema's) with opts, and
// when the test ends runs its Check, failing the test on counts that do
// not match the messages, and closes it; a store the test closed itself is
// opened again for the check.
func OpenPG(t testing.TB, schema string, opts pgstore.Options) *pgstore.Store {
	t.Helper()
	opts.Schema = schema
	return openChecked(t, func() (*pgstore.Store, error) { return pgstore.Open(context.Background(), PGURL(), opts) })
}
