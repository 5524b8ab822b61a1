package outbox

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/pgmigrate"
	"github.com/ordo-relay/ordo/partition"
)

//go:embed migrations/*.sql
var migrations embed.FS

// NotifyChannel is the LISTEN/NOTIFY channel on which the outbox's
// key_seq trigger (since migration 12; an AFTER INSERT statement trigger
// before) wakes the relays, at most once per partition a transaction
// wrote to, with the partition number as the payload. Anything
// else that wakes a relay (an operator's retry) notifies it too. The
// trigger spells the name in SQL; TestNotifyChannelIsTheTriggers checks
// that the two agree.
const NotifyChannel = "ordo_outbox"

// WakeLockClass is the first key of the advisory locks (WakeLockClass,
// partition) by which a relay arms a partition: since migration 10 the
// trigger notifies a partition only while a relay holds that lock, so
// that producers' commits take NOTIFY's database-wide lock only when a
// relay is idle and waits for them (docs/design.md, "Wake-ups"). It is
// 'ordo' read as ASCII. TestWakeLockClassIsTheTriggers checks that the
// trigger spells the same number. A transaction holds at most 16 of these
// locks (migration 12): it notifies the other partitions it writes to.
const WakeLockClass int32 = 0x6f72646f

// ErrPartitionMismatch is returned (wrapped in a *PartitionMismatchError) by
// Migrate and LoadPartitions when the database was installed with a
// different partition count than the one configured.
var ErrPartitionMismatch = errors.New("partition count differs from the installed one")

// PartitionMismatchError says which two partition counts disagree.
type PartitionMismatchError struct {
	Installed  int // the count stored in the database at install
	Configured int // the count this process was configured with
}

func (e *PartitionMismatchError) Error() string {
	return fmt.Sprintf("outbox was installed with %d partitions but this process is configured with %d; "+
		"the partition count cannot change after install (set ORDO_PARTITIONS=%d)",
		e.Installed, e.Configured, e.Installed)
}

func (e *PartitionMismatchError) Unwrap() error { return ErrPartitionMismatch }

// TxBeginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate brings the outbox schema up to date (component "outbox" in
// ordo_schema_migrations) and installs the partition count on first use.
// The lease tables are the lease package's (lease.Migrate), which a node
// applies after this. It is idempotent and safe to call from many processes
// at once. If the database already holds a different partition count it
// changes nothing and returns a *PartitionMismatchError.
func Migrate(ctx context.Context, db TxBeginner, partitions int) error {
	if err := partition.ValidateCount(partitions); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := pgmigrate.Lock(ctx, tx); err != nil {
			return err
		}
		if err := pgmigrate.Apply(ctx, tx, "outbox", migrations, "migrations"); err != nil {
			return err
		}
		return install(ctx, tx, partitions)
	})
}

func install(ctx context.Context, tx pgx.Tx, partitions int) error {
	installed, err := readPartitions(ctx, tx)
	switch {
	case err == nil && installed != partitions:
		return &PartitionMismatchError{Installed: installed, Configured: partitions}
	case err == nil:
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ordo_settings (partitions) VALUES ($1)`, partitions); err != nil {
		return fmt.Errorf("store partition count: %w", err)
	}
	// The range is the column's domain's constraint (migration 19: a
	// table constraint costs every INSERT statement its parse), NOT VALID
	// as in a database that migration upgraded (its rows were checked by
	// the table constraint it replaced; new values are checked all the
	// same). Before migration 19 (a test installing an earlier release)
	// it is the table's. DDL takes no parameters; partitions is a
	// validated int, not text input.
	var domain bool
	if err := tx.QueryRow(ctx, `SELECT to_regtype('outbox_partition') IS NOT NULL`).Scan(&domain); err != nil {
		return fmt.Errorf("look for the partition domain: %w", err)
	}
	ddl := fmt.Sprintf(`ALTER DOMAIN outbox_partition ADD CONSTRAINT outbox_partition_range CHECK (VALUE >= 0 AND VALUE < %d) NOT VALID`, partitions)
	if !domain {
		ddl = fmt.Sprintf(`ALTER TABLE outbox ADD CONSTRAINT outbox_partition_range CHECK (partition >= 0 AND partition < %d)`, partitions)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("add partition range constraint: %w", err)
	}
	return nil
}

func readPartitions(ctx context.Context, q Querier) (int, error) {
	var p int
	err := q.QueryRow(ctx, `SELECT partitions FROM ordo_settings`).Scan(&p)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("read partition count: %w", err)
	}
	return p, err
}

// Querier runs a query returning one row; pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotInstalled is returned by LoadPartitions when Migrate has not run.
var ErrNotInstalled = errors.New("outbox is not installed: run the migrations first (ordo node or orderapi do it at start)")

// LoadPartitions returns the installed partition count. If configured is
// non-zero and differs, it returns a *PartitionMismatchError.
func LoadPartitions(ctx context.Context, q Querier, configured int) (int, error) {
	p, err := readPartitions(ctx, q)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotInstalled
	}
	if err != nil {
		return 0, err
	}
	if configured != 0 && configured != p {
		return 0, &PartitionMismatchError{Installed: p, Configured: configured}
	}
	return p, nil
}
