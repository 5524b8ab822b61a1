package tablesource

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier is the part of a pgx connection, pool or transaction the
// package needs.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// columnTypes lists, for each mapped field, the column types Ordo can
// read, as format_type writes them without a modifier.
var columnTypes = map[string][]string{
	"ID":            {"uuid"},
	"Type":          {"text", "character varying", "character"},
	"RoutingKey":    {"text", "character varying", "character"},
	"Payload":       {"jsonb", "json", "text", "character varying"},
	"CorrelationID": {"text", "character varying", "character", "uuid"},
	"OccurredAt":    {"timestamp with time zone", "timestamp without time zone"},
	"ProcessedAt":   {"timestamp with time zone", "timestamp without time zone"},
}

// Check validates l and then compares it with the table in the database q
// is connected to. It reports every problem at once, in an error wrapping
// ErrInvalidLayout: a table that does not exist, a mapped column that
// does not exist or has a type Ordo cannot read, an OccurredAt column that
// allows NULL (a row without a time has no place in its key's order). It
// only reads the catalog.
func Check(ctx context.Context, q Querier, l Layout) error {
	if err := l.Validate(); err != nil {
		return err
	}
	var exists bool
	if err := q.QueryRow(ctx, sqlTableExists, l.QuotedTable()).Scan(&exists); err != nil {
		return fmt.Errorf("look up table %s: %w", l, err)
	}
	if !exists {
		return fmt.Errorf("%w: table %s does not exist (names are case-sensitive)", ErrInvalidLayout, l)
	}
	type attr struct {
		typ     string
		notNull bool
	}
	attrs := map[string]attr{}
	rows, err := q.Query(ctx, sqlColumns, l.QuotedTable())
	if err != nil {
		return fmt.Errorf("list the columns of %s: %w", l, err)
	}
	for rows.Next() {
		var name string
		var a attr
		if err := rows.Scan(&name, &a.typ, &a.notNull); err != nil {
			rows.Close()
			return fmt.Errorf("list the columns of %s: %w", l, err)
		}
		attrs[name] = a
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list the columns of %s: %w", l, err)
	}
	var problems []string
	for _, c := range l.columns() {
		a, ok := attrs[c.name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: column %s does not exist in %s", c.field, quote(c.name), l))
			continue
		}
		if !hasTypePrefix(a.typ, columnTypes[c.field]) {
			problems = append(problems, fmt.Sprintf("%s: column %s is %s, want one of %s",
				c.field, quote(c.name), a.typ, strings.Join(columnTypes[c.field], ", ")))
		}
		if c.field == "OccurredAt" && !a.notNull {
			problems = append(problems, fmt.Sprintf("%s: column %s allows NULL, want NOT NULL", c.field, quote(c.name)))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidLayout, strings.Join(problems, "; "))
	}
	return nil
}

// typeModifier matches a type's modifier as format_type writes it:
// "(200)" in "character varying(200)", "(3)" in "timestamp(3) with time
// zone".
var typeModifier = regexp.MustCompile(`\(\d+(,\d+)?\)`)

// hasTypePrefix reports whether typ, without its modifier, is one of
// types.
func hasTypePrefix(typ string, types []string) bool {
	return slices.Contains(types, typeModifier.ReplaceAllString(typ, ""))
}
