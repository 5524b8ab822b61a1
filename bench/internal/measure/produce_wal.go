package measure

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/outbox"

	"github.com/ordo-relay/ordo/bench/internal/harness"
)

// WALWatch reads WAL positions, and with inspect counts the WAL of one
// database between two of them with pg_walinspect. A checkpoint may
// remove the segments of a window before they are read, so an inspecting
// watch holds a temporary physical replication slot, which keeps WAL
// from its creation for as long as the watch's connection lives.
type WALWatch struct {
	conn    *pgx.Conn
	Inspect bool
}

// WatchWAL connects to dbURL; with inspect it installs pg_walinspect in
// the database and creates the slot.
func WatchWAL(ctx context.Context, dbURL string, inspect bool) (*WALWatch, error) {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("postgres-url: %w", err)
	}
	cfg.RuntimeParams["application_name"] = harness.AppProbe
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect for WAL positions: %w", err)
	}
	w := &WALWatch{conn: conn, Inspect: inspect}
	if !inspect {
		return w, nil
	}
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		w.Close()
		return nil, fmt.Errorf("create extension pg_walinspect (or run with -produce-wal-inspect=false): %w", err)
	}
	// Temporary: dropped when the connection ends, also if the bench dies.
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, "ordo_bench_wal_"+harness.RandomHex(6)); err != nil {
		w.Close()
		return nil, fmt.Errorf("create a temporary replication slot to keep the run's WAL (or run with -produce-wal-inspect=false): %w", err)
	}
	return w, nil
}

func (w *WALWatch) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), harness.SetupTimeout)
	defer cancel()
	_ = w.conn.Close(ctx)
}

// LSN returns the server's WAL insert position in bytes.
func (w *WALWatch) LSN(ctx context.Context) (int64, error) {
	var n int64
	if err := w.conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read WAL position: %w", err)
	}
	return n, nil
}

// sqlDatabaseWAL sums, by relation, the WAL records between two positions
// that belong to the current database: records whose first block is one
// of its relations (by relfilenode: "rel <tablespace>/<database>/<file>"),
// and, as "commit", the commit (or abort) records of the transactions
// that wrote them. Other databases' work and the server's own records
// are left out.
const sqlDatabaseWAL = `
WITH r AS (
    SELECT xid, resource_manager, record_length, fpi_length,
           substring(block_ref FROM ' rel \d+/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/(\d+) ')::oid AS file
    FROM pg_get_wal_records_info(('0/0'::pg_lsn + $1::numeric), ('0/0'::pg_lsn + $2::numeric))
), xids AS (
    SELECT DISTINCT xid FROM r WHERE file IS NOT NULL AND xid <> 0
)
SELECT coalesce(c.relname, 'other'), sum(r.record_length)::bigint, sum(r.fpi_length)::bigint FROM r
LEFT JOIN pg_class AS c ON c.relfilenode = r.file
WHERE r.file IS NOT NULL GROUP BY 1
UNION ALL
SELECT 'commit', coalesce(sum(record_length), 0)::bigint, 0 FROM r
WHERE resource_manager = 'Transaction' AND xid IN (SELECT xid FROM xids)`

// ByRelation returns the bytes of WAL, by relation, that the current
// database's work wrote between from and to, and how many of them were
// full-page images, waiting (briefly) until to is flushed.
func (w *WALWatch) ByRelation(ctx context.Context, from, to int64) (map[string]int64, int64, error) {
	err := harness.WaitUntil(ctx, 10*time.Second, 10*time.Millisecond, "WAL flushed", func() (bool, error) {
		var flushed int64
		err := w.conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn`).Scan(&flushed)
		return flushed >= to, err
	})
	if err != nil {
		return nil, 0, err
	}
	rows, err := w.conn.Query(ctx, sqlDatabaseWAL, from, to)
	if err != nil {
		return nil, 0, fmt.Errorf("inspect WAL: %w", err)
	}
	out := map[string]int64{}
	var fpi int64
	for rows.Next() {
		var rel string
		var n, f int64
		if err := rows.Scan(&rel, &n, &f); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("inspect WAL: %w", err)
		}
		out[rel] += n
		fpi += f
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("inspect WAL: %w", err)
	}
	return out, fpi, nil
}

// KeysHOT returns outbox_keys' updates and HOT updates, once the
// statistics of every insert have arrived (without the key_seq trigger,
// those that have) (each row inserted or updated
// one counter row); 0, 0 where the database has no outbox_keys or no
// counter was written.
func KeysHOT(ctx context.Context, q *pgxpool.Pool) (upd, hot int64, err error) {
	var has bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('outbox_keys') IS NOT NULL`).Scan(&has); err != nil || !has {
		return 0, 0, err
	}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_keys)`).Scan(&has); err != nil || !has {
		return 0, 0, err // no counter was written (bare)
	}
	trigger, err := outbox.KeySeqTriggerInstalled(ctx, q)
	if err != nil {
		return 0, 0, err
	}
	if !trigger {
		// The owner numbers the rows, one counter update per key and
		// read: nothing says how many to wait for. What has arrived.
		err := q.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'outbox_keys'`).Scan(&upd, &hot)
		return upd, hot, err
	}
	var rows int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil {
		return 0, 0, fmt.Errorf("count outbox rows: %w", err)
	}
	err = harness.WaitUntil(ctx, 10*time.Second, 20*time.Millisecond, "outbox_keys statistics", func() (bool, error) {
		var ins int64
		err := q.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_tup_ins FROM pg_stat_user_tables WHERE relname = 'outbox_keys'`).
			Scan(&upd, &hot, &ins)
		return upd+ins >= rows, err
	})
	return upd, hot, err
}
