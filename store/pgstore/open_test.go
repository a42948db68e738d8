package pgstore_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/delayproxy/delayproxy/internal/teststore"
	"github.com/delayproxy/delayproxy/store/pgstore"
)

// exec runs statements on the test database as its superuser.
func exec(t *testing.T, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, teststore.PGURL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// withUser is the test database's URL with another user and password.
func withUser(t *testing.T, user, password string) string {
	u, err := url.Parse(teststore.PGURL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// TestOpenErrors: what cannot be opened is one line naming the cause,
// never the password.
func TestOpenErrors(t *testing.T) {
	role := fmt.Sprintf("dp_noperm_%s", strings.ToLower(teststore.PGSchema(t)))
	exec(t, "DROP ROLE IF EXISTS "+role, "CREATE ROLE "+role+" LOGIN PASSWORD 'hunter2'")
	t.Cleanup(func() { exec(t, "DROP ROLE IF EXISTS "+role) })
	newer := teststore.PGSchema(t)
	exec(t, "CREATE SCHEMA "+newer, "CREATE TABLE "+newer+".schema_version (version integer NOT NULL)",
		"INSERT INTO "+newer+".schema_version VALUES (99)")
	for _, tc := range []struct {
		name, url, schema string
		want              []string
	}{
		{"unparsable", "postgres://u:hunter2@host:notaport/db", "x", []string{"not a valid PostgreSQL URL", "invalid port"}},
		{"unreachable", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2", "x", []string{"cannot connect", "127.0.0.1"}},
		{"no permission to create the schema", withUser(t, role, "hunter2"), teststore.PGSchema(t), []string{"create schema", "permission denied", "42501"}},
		{"newer schema", teststore.PGURL(), newer, []string{"version 99", "newer than this delayproxy's 3"}},
		{"bad schema name", teststore.PGURL(), "Bad-Name", []string{"schema name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := pgstore.Open(context.Background(), tc.url, pgstore.Options{Schema: tc.schema})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			msg := err.Error()
			t.Log(msg)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
			if strings.Contains(msg, "hunter2") || strings.Contains(msg, "\n") {
				t.Errorf("error %q shows the password or is not one line", msg)
			}
		})
	}
}
