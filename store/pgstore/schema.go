package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schemaVersion is the version this code writes; Open migrates an older
// schema up to it and refuses a newer one.
const schemaVersion = 3

// migrations[i] takes the schema from version i to i+1. "S." stands for the
// schema's name. See doc.go for the tables drawn.
var migrations = []string{
	`
CREATE SEQUENCE S.incarnations;
CREATE SEQUENCE S.message_seq INCREMENT BY 1024;
CREATE TABLE S.exchanges (
	vhost        text     NOT NULL,
	name         text     NOT NULL,
	kind         smallint NOT NULL,
	delayed_type text     NOT NULL,
	durable      boolean  NOT NULL,
	auto_delete  boolean  NOT NULL,
	internal     boolean  NOT NULL,
	arguments    bytea    NOT NULL,
	incarnation  bigint   NOT NULL UNIQUE DEFAULT nextval('S.incarnations'),
	PRIMARY KEY (vhost, name)
);
CREATE TABLE S.messages (
	k           bytea    PRIMARY KEY,
	incarnation bigint   NOT NULL,
	vhost       text     NOT NULL,
	exchange    text     NOT NULL,
	routing_key text     NOT NULL,
	mandatory   boolean  NOT NULL,
	properties  bytea    NOT NULL,
	body        bytea    NOT NULL,
	delay       bigint   NOT NULL,
	priority    smallint NOT NULL,
	message_id  text     NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01,
	autovacuum_vacuum_cost_delay = 0);
CREATE INDEX messages_incarnation ON S.messages (incarnation, k);
CREATE INDEX messages_message_id ON S.messages (vhost, exchange, message_id) WHERE message_id <> '';
CREATE TABLE S.counts (
	incarnation bigint   NOT NULL,
	shard       smallint NOT NULL,
	n           bigint   NOT NULL,
	PRIMARY KEY (incarnation, shard)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);
CREATE FUNCTION S.require_live(vhosts text[], names text[], incarnations bigint[]) RETURNS void
LANGUAGE plpgsql AS $f$
BEGIN
	IF EXISTS (SELECT 1 FROM unnest(vhosts, names, incarnations) AS u(v, n, i) WHERE NOT EXISTS (
			SELECT 1 FROM S.exchanges e WHERE e.vhost = u.v AND e.name = u.n AND e.incarnation = u.i)) THEN
		RAISE EXCEPTION 'not a live exchange incarnation' USING ERRCODE = 'DP001';
	END IF;
END
$f$;
CREATE TABLE S.tally (
	minute bigint   NOT NULL,
	shard  smallint NOT NULL,
	n      bigint   NOT NULL,
	PRIMARY KEY (minute, shard)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 1000);
`,
	// Version 2: the partitions of the releaser role (partition.go). The
	// index served a partition's scans in key order; the tally rows of a
	// minute are kept per partition (shard = partition * 16 + the
	// committer's shard), rebuilt here from the messages.
	`
CREATE INDEX messages_partition ON S.messages ((incarnation % 8), k);
DELETE FROM S.tally;
INSERT INTO S.tally (minute, shard, n)
	SELECT (('x' || encode(substr(k, 1, 8), 'hex'))::bit(64)::bigint) / 60000, ((incarnation % 8) * 16)::smallint, count(*)
	FROM S.messages GROUP BY 1, 2;
`,
	// Version 3: the partition leads the primary key (part, k), which
	// serves the lookups by key and a partition's scans in key order, in
	// place of the index messages_partition: one index less to write per
	// message. A key's sequence says its partition (partOf), so the stored
	// keys get sequence * 8 + partition, in the same order as before.
	`
DROP INDEX S.messages_partition;
ALTER TABLE S.messages DROP CONSTRAINT messages_pkey, ADD COLUMN part smallint;
UPDATE S.messages SET part = incarnation % 8,
	k = substr(k, 1, 9) || int8send((('x' || encode(substr(k, 10, 8), 'hex'))::bit(64)::bigint) * 8 + incarnation % 8);
ALTER TABLE S.messages ALTER COLUMN part SET NOT NULL, ADD PRIMARY KEY (part, k);
`,
}

// sql puts the schema's name into a statement written with "S.".
func sql(schema, q string) string { return strings.ReplaceAll(q, "S.", schema+".") }

// migrate creates the schema when missing and brings it to schemaVersion,
// under a transaction-scoped advisory lock so that nodes starting together
// migrate once.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return migrateTo(ctx, pool, schema, schemaVersion)
}

// migrateTo is migrate up to version target (tests make older schemas).
func migrateTo(ctx context.Context, pool *pgxpool.Pool, schema string, target int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('delayproxy schema ' || $1))`, schema); err != nil {
		return err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
	}
	if _, err := tx.Exec(ctx, sql(schema, `CREATE TABLE IF NOT EXISTS S.schema_version (version integer NOT NULL)`)); err != nil {
		return fmt.Errorf("create %s.schema_version: %w", schema, err)
	}
	version := 0
	err = tx.QueryRow(ctx, sql(schema, `SELECT version FROM S.schema_version`)).Scan(&version)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, sql(schema, `INSERT INTO S.schema_version VALUES (0)`)); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	if version > target {
		return fmt.Errorf("schema %s has version %d, newer than this delayproxy's %d: upgrade delayproxy", schema, version, schemaVersion)
	}
	for v := version; v < target; v++ {
		if _, err := tx.Exec(ctx, sql(schema, migrations[v])); err != nil {
			return fmt.Errorf("migrate schema %s to version %d: %w", schema, v+1, err)
		}
	}
	if version < target {
		if _, err := tx.Exec(ctx, sql(schema, `UPDATE S.schema_version SET version = $1`), target); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
