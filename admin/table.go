package admin

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/relay/tablesource"
)

// NewTableStore returns a Store over the rows a node took in from the
// adopted table of layout l (ordo_table_rows, relay/tablesource), whose
// messages go to exchange. It lists, retries and skips parked rows as
// NewStore's does, recorded in the same ordo_operator_audit (which
// tablesource.Migrate creates). A skip also sets the user's row's
// processed-at, so that the table's own queries count it done and the
// intake never takes it in again. Purge and the gap actions return
// ErrNotSupported: retention deletes the dead rows, and the partition
// owner numbers the rows, so no gap is an operator's to fill.
func NewTableStore(pool *pgxpool.Pool, l tablesource.Layout, exchange string) (*Store, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &Store{pool: pool, sql: tableStatements(l, exchange)}, nil
}

// tableStatements are the actions' SQL over ordo_table_rows, with the
// user's table of l for what a row carries (type, routing key) and for
// a skip's processed-at.
func tableStatements(l tablesource.Layout, exchange string) statements {
	col := func(name string) string { return "m." + pgx.Identifier{name}.Sanitize() }
	table := l.QuotedTable()
	return statements{
		// A parked row waits ahead of every later row of its key that is
		// not dead, numbered or not yet numbered.
		listParked: fmt.Sprintf(`
SELECT r.id, r.partition, r.key, coalesce(r.key_seq, 0), '', coalesce(%s::text, ''), coalesce(%s::text, ''),
       r.attempts, coalesce(r.last_error, r.problem), r.parked_at,
       (SELECT count(*) FROM ordo_table_rows AS w
        WHERE w.key = r.key AND w.id <> r.id AND w.dead_at IS NULL AND (w.key_seq > r.key_seq OR w.key_seq IS NULL))
FROM ordo_table_rows AS r
LEFT JOIN %s AS m ON %s = r.id
WHERE r.parked_at IS NOT NULL AND r.dead_at IS NULL
ORDER BY r.parked_at
LIMIT $1`, col(l.RoutingKey), col(l.Type), table, col(l.ID)),
		retry: `
UPDATE ordo_table_rows SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
WHERE id = $1 AND parked_at IS NOT NULL AND dead_at IS NULL
RETURNING partition`,
		retryKey: `
UPDATE ordo_table_rows SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
WHERE key = $1 AND parked_at IS NOT NULL AND dead_at IS NULL
RETURNING partition`,
		retryMatching: `
UPDATE ordo_table_rows SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
WHERE parked_at IS NOT NULL AND dead_at IS NULL
  AND ($1::text IS NULL OR strpos(coalesce(last_error, problem, ''), $1) > 0)
  AND ($2::text IS NULL OR starts_with(key, $2))
RETURNING partition`,
		// The dead row keeps its number, which the key's next row steps
		// over; the user's row is processed in the same statement.
		skip: fmt.Sprintf(`
WITH skipped AS (
    UPDATE ordo_table_rows SET dead_at = clock_timestamp(), parked_at = NULL, next_attempt_at = NULL
    WHERE id = $1 AND parked_at IS NOT NULL AND dead_at IS NULL AND key_seq IS NOT NULL
    RETURNING id, partition
), processed AS (
    UPDATE %s AS m SET %s = clock_timestamp()
    FROM skipped WHERE %s = skipped.id AND %s IS NULL
)
SELECT partition FROM skipped`, table, pgx.Identifier{l.ProcessedAt}.Sanitize(), col(l.ID), col(l.ProcessedAt)),
		exists:   `SELECT EXISTS (SELECT 1 FROM ordo_table_rows WHERE id = $1)`,
		exchange: exchange,
		table:    true,
		channel:  tablesource.NotifyChannel(l),
	}
}
