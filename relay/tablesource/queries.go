package tablesource

import "fmt"

// The queries are built once per Layout from its quoted identifiers
// (pgx.Identifier.Sanitize): no value is ever spliced in, every value is a
// parameter.

// pendingSQL returns the two reads of pending rows: from the start, and
// after a position ($1 occurred-at, $2 id). $N is the limit.
//
// The only index the read relies on is the one the article's table
// already has: "OccurredAt" where "ProcessedAt" is null. Ties in
// "OccurredAt" are ordered by an incremental sort on "Id". Every column
// is qualified with the alias m: an unqualified ORDER BY name would bind
// to the output column of the same name, the id's text form, not the
// uuid the position compares.
func pendingSQL(l Layout) (first, after string) {
	col := func(name string) string { return "m." + quote(name) }
	cols := fmt.Sprintf(`%s::text, %s::text, %s::text, %s::text, %s::text, %s`,
		col(l.ID), col(l.Type), col(l.RoutingKey), col(l.Payload), col(l.CorrelationID), col(l.OccurredAt))
	from := fmt.Sprintf(`FROM %s AS m WHERE %s IS NULL`, l.QuotedTable(), col(l.ProcessedAt))
	order := fmt.Sprintf(`ORDER BY %s, %s`, col(l.OccurredAt), col(l.ID))
	first = fmt.Sprintf(`SELECT %s %s %s LIMIT $1`, cols, from, order)
	after = fmt.Sprintf(`SELECT %s %s AND (%s, %s) > ($1, $2) %s LIMIT $3`,
		cols, from, col(l.OccurredAt), col(l.ID), order)
	return first, after
}

// newestSQL returns the idle intake's probe (Intake.newer): the newest
// pending row's occurred-at after $1, NULL when there is none. PostgreSQL
// reads it from the end of the partial index down to $1, with or without
// statistics, generic plan or custom, even planned on an empty table:
// the only plan of a max() over an index's leading column that is
// cheaper than the table (TestPendingPlanWithoutStatistics). The bound
// keeps the walk off the entries of rows marked processed and not yet
// vacuumed, which lie below it.
func newestSQL(l Layout) string {
	return fmt.Sprintf(`SELECT max(m.%[1]s) FROM %[2]s AS m WHERE m.%[3]s IS NULL AND m.%[1]s > $1`,
		quote(l.OccurredAt), l.QuotedTable(), quote(l.ProcessedAt))
}

// sqlTableExists says whether $1 (a quoted, possibly schema-qualified
// table name) names a table or view the session can see.
const sqlTableExists = `SELECT to_regclass($1) IS NOT NULL`

// sqlColumns lists the columns of the table $1 names: name, type as
// format_type writes it, and whether it is NOT NULL.
const sqlColumns = `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute AS a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// sqlPlannerSettings leaves the pending reads one sensible plan, the
// partial index walked in order (an incremental sort for ties), for the
// rest of the transaction.
const sqlPlannerSettings = `SELECT set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('enable_sort', 'off', true)`
