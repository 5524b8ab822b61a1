package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// sqlWALRecords lists, for the WAL between two positions, the records of
// the current database's relations: "<relation> <rmgr>/<record type>".
const sqlWALRecords = `
SELECT coalesce(c.relname, 'other') || ' ' || r.resource_manager || '/' || r.record_type
FROM (SELECT resource_manager, record_type,
             substring(block_ref FROM ' rel \d+/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/(\d+) ')::oid AS file
      FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)) AS r
LEFT JOIN pg_class AS c ON c.relfilenode = r.file
WHERE r.file IS NOT NULL`

// TestKeySeqWAL: the WAL an INSERT of a key's later row writes besides
// its own row and indexes is one HOT update of the key's counter row: no
// row lock record (the upsert's ON CONFLICT path took one before
// updating), no entry in the counter's primary key (a HOT update needs
// room on the page: outbox_keys' fillfactor), and the outbox's indexes
// are its primary key, (correlation_id, key_seq), the pending rows by
// partition and the pending rows the relay reads (neither parked nor
// held) by partition (the unique index on seq is gone). Read with
// pg_walinspect.
func TestKeySeqWAL(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		t.Skipf("pg_walinspect is not available: %v", err)
	}

	// Long keys, so that the counter rows fill several pages: without
	// room on its page, an update cannot be HOT.
	const keys = 100
	keyOf := func(k int) string { return fmt.Sprintf("wal-%03d-%s", k%keys, strings.Repeat("x", 200)) }
	for k := range keys {
		key := keyOf(k)
		if _, err := pool.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), partition.Of(key, 64), key); err != nil {
			t.Fatal(err)
		}
	}
	// Each key's second row: its counter's page is at most half full, so
	// the new version fits whatever else runs. (Later increments fit once
	// the page is pruned of the versions no snapshot needs; a long
	// transaction can hold that back, and then the page fills up.)
	for k := range keys {
		key := keyOf(k)
		records := insertWAL(t, ctx, pool, key)
		var keyRecords, indexInserts []string
		for _, r := range records {
			rel, what, _ := strings.Cut(r, " ")
			switch {
			case strings.HasPrefix(rel, "outbox_keys") && (strings.HasPrefix(what, "Heap/") || btreeInsert(what)):
				// (Heap2 records are pruning and vacuum: autovacuum may
				// run any time.)
				keyRecords = append(keyRecords, r)
			case btreeInsert(what) && !slices.Contains(indexInserts, rel):
				indexInserts = append(indexInserts, rel)
			}
		}
		slices.Sort(indexInserts)
		if !slices.Equal(keyRecords, []string{"outbox_keys Heap/HOT_UPDATE"}) {
			t.Fatalf("row %d (key %.7s): the counter wrote %q, want one HOT update; all records: %q", k+keys+1, key, keyRecords, records)
		}
		if want := []string{"outbox_key_seq_key", "outbox_pending_by_partition", "outbox_pkey", "outbox_ready_by_partition"}; !slices.Equal(indexInserts, want) {
			t.Fatalf("row %d: index entries in %q, want %q; all records: %q", k+keys+1, indexInserts, want, records)
		}
	}
}

// btreeInsert reports whether a WAL record adds an index entry: an insert
// into a leaf, or a page split (which carries the new entry) and what
// follows it up the tree.
func btreeInsert(what string) bool {
	switch what {
	case "Btree/INSERT_LEAF", "Btree/SPLIT_L", "Btree/SPLIT_R", "Btree/INSERT_UPPER", "Btree/NEWROOT":
		return true
	}
	return false
}

// insertWAL inserts one row of key in a transaction of its own and
// returns the WAL records of this database that it wrote.
func insertWAL(t *testing.T, ctx context.Context, pool *pgxpool.Pool, key string) []string {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var from, to string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, plainInsert, uuid.Must(uuid.NewV7()), partition.Of(key, 64), key); err != nil {
		t.Fatal(err)
	}
	// The commit has been flushed: every record of the insert is below.
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&to); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, sqlWALRecords, from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
