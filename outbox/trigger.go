package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
// TRIGGER waits for the inserts under way to commit.
func DropKeySeqTrigger(ctx context.Context, db TxBeginner) error {
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
		if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS outbox_assign_key_seq ON outbox`); err != nil {
			return fmt.Errorf("drop the key_seq trigger: %w", err)
		}
		return nil
	})
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
	rows, err := db.Query(ctx, sqlOldNodes)
	if err != nil {
		return nil, fmt.Errorf("list the nodes that do not number rows: %w", err)
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the nodes that do not number rows: %w", err)
	}
	return old, nil
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
