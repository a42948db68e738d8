package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateTo creates schema at url, or migrates it, up to version: tests of
// upgrades make older schemas with it.
func MigrateTo(ctx context.Context, url, schema string, version int) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrateTo(ctx, pool, schema, version)
}

// ViewQueries are the statements of a View's ScanKeys and NextDue, with
// "S." for the schema, for tests of their plans.
var ViewQueries = map[string]string{"scan": keyChunkFromSQL, "next due": nextDueSQL}
