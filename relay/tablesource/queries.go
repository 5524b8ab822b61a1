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
// "OccurredAt" are ordered by an incremental sort on "Id".
func pendingSQL(l Layout) (first, after string) {
	cols := fmt.Sprintf(`%[1]s::text, %[2]s::text, %[3]s::text, %[4]s::text, %[5]s::text, %[6]s`,
		quote(l.ID), quote(l.Type), quote(l.RoutingKey), quote(l.Payload), quote(l.CorrelationID), quote(l.OccurredAt))
	from := fmt.Sprintf(`FROM %s WHERE %s IS NULL`, l.QuotedTable(), quote(l.ProcessedAt))
	order := fmt.Sprintf(`ORDER BY %[1]s, %[2]s`, quote(l.OccurredAt), quote(l.ID))
	first = fmt.Sprintf(`SELECT %s %s %s LIMIT $1`, cols, from, order)
	after = fmt.Sprintf(`SELECT %s %s AND (%s, %s) > ($1, $2) %s LIMIT $3`,
		cols, from, quote(l.OccurredAt), quote(l.ID), order)
	return first, after
}

// sqlTableExists says whether $1 (a quoted, possibly schema-qualified
// table name) names a table or view the session can see.
const sqlTableExists = `SELECT to_regclass($1) IS NOT NULL`

// sqlColumns lists the columns of the table $1 names: name, type as
// format_type writes it, and whether it is NOT NULL.
const sqlColumns = `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute AS a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`
