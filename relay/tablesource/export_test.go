package tablesource

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ExplainPending returns EXPLAIN ANALYZE of the pending read as Pending
// runs it: same transaction settings, same SQL.
func (r *Reader) ExplainPending(ctx context.Context, db TxBeginner, after *Position, limit int) (string, error) {
	sql, args := r.sqlFirst, []any{limit}
	if after != nil {
		sql, args = r.sqlAfter, []any{after.OccurredAt, after.ID, limit}
	}
	var lines []string
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := plannerSettings(ctx, tx); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+sql, args...)
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return strings.Join(lines, "\n"), err
}

// ExplainTakeGeneric is ExplainTake with the generic plan PostgreSQL may
// keep for the prepared intake statement (plan_cache_mode
// force_generic_plan), planned in the intake's transaction.
func (in *Intake) ExplainTakeGeneric(ctx context.Context, rows []Row) (string, error) {
	var lines []string
	err := in.inPlan(ctx, rows, func(tx pgx.Tx, args []any) error {
		name := "generic_take_" + strings.ReplaceAll(uuid.NewString(), "-", "")
		for _, stmt := range []string{"SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE " + name + " AS " + in.sql} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		// EXECUTE under EXPLAIN takes no bound parameters: literals,
		// which PostgreSQL writes from the arguments.
		types := []string{"uuid[]", "int[]", "text[]", "timestamptz[]", "text[]", "text", "text[]"}
		if len(types) != len(args) {
			return fmt.Errorf("%d intake arguments, %d types", len(args), len(types))
		}
		lits := make([]string, len(args))
		for i, a := range args {
			if err := tx.QueryRow(ctx, "SELECT quote_nullable($1::"+types[i]+") || '::"+types[i]+"'", a).Scan(&lits[i]); err != nil {
				return err
			}
		}
		r, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE "+name+"("+strings.Join(lits, ", ")+")")
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(r, pgx.RowTo[string])
		return err
	})
	return strings.Join(lines, "\n"), err
}

// SetAfterPage makes f run after each page a pass of in takes in.
func (in *Intake) SetAfterPage(f func()) { in.afterPage = f }

// SetOnTake makes f run before each take of a page's rows, with their
// number.
func (in *Intake) SetOnTake(f func(n int)) { in.onTake = f }

// SetNumberKeys bounds the keys one numbering statement of s numbers.
func (s *Store) SetNumberKeys(n int) { s.numberKeys = n }

// ReadSQL and MarkSQL are the Store's key-head read and mark, as they
// run.
func (s *Store) ReadSQL() string { return s.sql.read }
func (s *Store) MarkSQL() string { return s.sql.mark }

// ExplainTake takes rows in as Pass does, under EXPLAIN (ANALYZE,
// BUFFERS), and returns the plan.
func (in *Intake) ExplainTake(ctx context.Context, rows []Row) (string, error) {
	var lines []string
	err := in.inPlan(ctx, rows, func(tx pgx.Tx, args []any) error {
		r, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) "+in.sql, append([]any{planFresh}, args...)...)
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(r, pgx.RowTo[string])
		return err
	})
	return strings.Join(lines, "\n"), err
}

// SetOnProbe makes f run after each probe of an idle intake that did not
// fail, with whether it found a newer row pending.
func (in *Intake) SetOnProbe(f func(newer bool)) { in.onProbe = f }

// ExplainNewest returns EXPLAIN (ANALYZE, BUFFERS) of the idle intake's
// probe for rows after after.
func (in *Intake) ExplainNewest(ctx context.Context, after time.Time) (string, error) {
	rows, err := in.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) "+in.newest, after)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// NewestSQL is the idle intake's probe.
func (in *Intake) NewestSQL() string { return in.newest }

// inPlan runs f in a transaction confined as the intake's take is
// (sqlIntakePlan), given the take's arguments for rows.
func (in *Intake) inPlan(ctx context.Context, rows []Row, f func(tx pgx.Tx, args []any) error) error {
	return pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlIntakePlan); err != nil {
			return err
		}
		return f(tx, in.takeArgs(rows))
	})
}

// SetOnHolderCheck makes f run after each check of partition 0's lease
// by Run that did not fail, with whether the node holds it.
func (in *Intake) SetOnHolderCheck(f func(held bool)) { in.onHolderCheck = f }

// Take takes rows in as a pass does (the intake's pipeline), without
// reading them: the benchmarks' way to time the take alone.
func (in *Intake) Take(ctx context.Context, rows []Row) (int, error) { return in.take(ctx, rows) }
