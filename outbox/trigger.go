package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
)

// ErrOldNodesRunning is returned (wrapped, naming the nodes) by
// DropKeySeqTrigger while a node that holds a lease has not recorded that
// it numbers rows: a relay older than the numbering, which cannot read a
// row without key_seq.
var ErrOldNodesRunning = errors.New("nodes that do not number rows hold leases")

// DropKeySeqTrigger drops the producers' key_seq trigger
// (outbox_assign_key_seq), after which a producer's INSERT runs no
// trigger and the partition owners number the rows (docs/outbox-table.md,
// "Who numbers a key's rows"). It refuses with ErrOldNodesRunning while
// any node holding an unexpired lease is not in ordo_numbering_nodes
// (every relay records itself there before its first read). Run it once
// every node runs a release that numbers rows; dropping a trigger that is
// gone already succeeds. It runs under the migration lock, and DROP
// TRIGGER waits for the inserts under way to commit, at most as long as
// a migration waits for a lock (15 s): DropKeySeqTriggerWithin.
//
// In the same transaction it drops outbox_pending_by_partition, an index
// over every pending row that producers pay for and relays of release 2
// (migration 18) no longer read, if no node holding an unexpired lease
// is of an older release (PendingIndexUsers); otherwise it keeps the
// index, and a later call, once those nodes are upgraded, drops it. In
// the same way it drops outbox_dead_is_processed, the last table
// constraint a producer's INSERT prepares, once no node holding a lease
// is of a release before 3 (DeadCheckUsers): relays of release 3 clear a
// dead_at they did not write when they mark the row, and purge only
// processed rows.
func DropKeySeqTrigger(ctx context.Context, db TxBeginner) error {
	return DropKeySeqTriggerWithin(ctx, db, pgmigrate.LockTimeout)
}

// DropKeySeqTriggerWithin is DropKeySeqTrigger with the wait for the
// outbox's lock bounded by lockTimeout (rounded to milliseconds; at
// least 1). Every insert that comes meanwhile queues behind the waiting
// DROP TRIGGER: an operator who cannot have producers stall for long
// gives a short bound, and a wait that runs out fails with SQLSTATE
// 55P03 (lock_not_available) having dropped nothing.
func DropKeySeqTriggerWithin(ctx context.Context, db TxBeginner, lockTimeout time.Duration) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		old, err := OldNodes(ctx, tx)
		if err != nil {
			return err
		}
		if len(old) > 0 {
			return fmt.Errorf("keep the key_seq trigger: %w: %s (upgrade or stop them, and let their leases expire)",
				ErrOldNodesRunning, strings.Join(old, ", "))
		}
		wait := strconv.FormatInt(max(lockTimeout.Milliseconds(), 1), 10)
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, wait); err != nil {
			return fmt.Errorf("bound the wait for the outbox's lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS outbox_assign_key_seq ON outbox`); err != nil {
			return fmt.Errorf("drop the key_seq trigger: %w", err)
		}
		users, err := PendingIndexUsers(ctx, tx)
		if err != nil || len(users) > 0 {
			return err
		}
		if _, err := tx.Exec(ctx, `DROP INDEX IF EXISTS outbox_pending_by_partition`); err != nil {
			return fmt.Errorf("drop outbox_pending_by_partition: %w", err)
		}
		if users, err := DeadCheckUsers(ctx, tx); err != nil || len(users) > 0 {
			return err
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_dead_is_processed`); err != nil {
			return fmt.Errorf("drop outbox_dead_is_processed: %w", err)
		}
		return nil
	})
}

// PendingIndexUsers returns, in name order, the nodes that hold an
// unexpired lease and have not recorded release 2 or later in
// ordo_numbering_nodes: relays that may still read through
// outbox_pending_by_partition, which DropKeySeqTrigger keeps while there
// are any.
func PendingIndexUsers(ctx context.Context, db RowsQuerier) ([]string, error) {
	return leaseHolders(ctx, db, "the nodes of releases before 2", sqlHoldersBelowRelease, 2)
}

// DeadCheckUsers returns, in name order, the nodes that hold an unexpired
// lease and have not recorded release 3 or later: relays whose mark keeps
// a dead_at a producer wrote, for which DropKeySeqTrigger keeps
// outbox_dead_is_processed.
func DeadCheckUsers(ctx context.Context, db RowsQuerier) ([]string, error) {
	return leaseHolders(ctx, db, "the nodes of releases before 3", sqlHoldersBelowRelease, 3)
}

// DeadCheckInstalled reports whether outbox_dead_is_processed, the table
// constraint DropKeySeqTrigger drops once every relay ignores a dead_at it
// did not write, is installed.
func DeadCheckInstalled(ctx context.Context, db Querier) (bool, error) {
	var on bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint
		WHERE conname = 'outbox_dead_is_processed' AND conrelid = 'outbox'::regclass)`).Scan(&on); err != nil {
		return false, fmt.Errorf("look for outbox_dead_is_processed: %w", err)
	}
	return on, nil
}

// leaseHolders runs sql with args, a list of node names, and returns
// them; what names them in its error.
func leaseHolders(ctx context.Context, db RowsQuerier, what, sql string, args ...any) ([]string, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", what, err)
	}
	return nodes, nil
}

// PendingIndexInstalled reports whether outbox_pending_by_partition, the
// index DropKeySeqTrigger drops once no relay reads it, is installed.
func PendingIndexInstalled(ctx context.Context, db Querier) (bool, error) {
	var on bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('outbox_pending_by_partition') IS NOT NULL`).Scan(&on); err != nil {
		return false, fmt.Errorf("look for outbox_pending_by_partition: %w", err)
	}
	return on, nil
}

// RowsQuerier runs a query; pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy
// it.
type RowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// OldNodes returns, in name order, the nodes that hold an unexpired lease
// and have not recorded that they number rows (ordo_numbering_nodes): the
// nodes that keep the key_seq trigger needed. An operator can run its
// query by hand (docs/outbox-table.md, "Dropping the trigger").
func OldNodes(ctx context.Context, db RowsQuerier) ([]string, error) {
	return leaseHolders(ctx, db, "the nodes that do not number rows", sqlOldNodes)
}

// KeySeqTriggerInstalled reports whether the producers' key_seq trigger is
// installed on the outbox.
func KeySeqTriggerInstalled(ctx context.Context, db Querier) (bool, error) {
	var on bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger
		WHERE tgname = 'outbox_assign_key_seq' AND tgrelid = 'outbox'::regclass)`).Scan(&on)
	if err != nil {
		return false, fmt.Errorf("look for the key_seq trigger: %w", err)
	}
	return on, nil
}
