// Package testpg gives tests the real PostgreSQL (PG_URL, default the
// machine's at 127.0.0.1:5432 with trust auth): a schema of their own,
// dropped when the test ends. A test that cannot reach it fails, never
// skips.
package testpg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultURL is the PostgreSQL the tests use when PG_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres"

// URL is PG_URL, or DefaultURL.
func URL() string {
	if u := os.Getenv("PG_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Schema returns the name of a new, empty schema in URL's database, dropped
// with everything in it when the test ends.
func Schema(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	Exec(t, URL(), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	t.Cleanup(func() { Exec(t, URL(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE") })
	return name
}

// Exec runs one statement on a connection of its own to url.
func Exec(t testing.TB, url, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testpg: PostgreSQL at %s unreachable: %v", url, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testpg: %s: %v", sql, err)
	}
}
