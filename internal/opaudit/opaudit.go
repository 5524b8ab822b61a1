// Package opaudit runs an operator's action against PostgreSQL and
// records its outcome in an audit table, whatever it is: the one
// pattern that package admin (the outbox's parked messages) and package
// inbox (a consumer's keys) share.
//
// An action and the record of its result commit together, synchronously
// (an action reported done to an operator must survive a database crash,
// whatever the session's synchronous_commit). An action that did not
// commit is recorded on its own afterwards: "error: …" when it surely did
// not take effect (it failed, or the database answered the COMMIT with an
// error, or the COMMIT was never sent), and "unknown: …" when the
// connection failed after the COMMIT was sent: the action may have taken
// effect, with its own record, or not.
package opaudit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrOutcomeUnknown is returned (wrapped) by Run when the connection
// failed while the action was committing.
var ErrOutcomeUnknown = errors.New("the action's outcome is unknown: the database connection failed while it committed")

// Beginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Record writes one audit row with result in tx.
type Record func(ctx context.Context, tx pgx.Tx, result string) error

// failureRecordTimeout bounds the record of an action that did not
// commit, which runs after the caller's context may have ended (it may be
// what ended the action).
const failureRecordTimeout = 10 * time.Second

// Run runs action in a transaction that commits synchronously, records
// the result it returns with record in the same transaction, and commits.
// If that fails, it records "error: " or "unknown: " and the error in a
// transaction of its own, and returns the error, wrapping
// ErrOutcomeUnknown in the second case (joined with the record's error
// if that failed too). beforeCommit, when not nil, runs just before the
// COMMIT (tests use it to lose the COMMIT's answer).
func Run(ctx context.Context, db Beginner, action func(pgx.Tx) (string, error), record Record, beforeCommit func()) error {
	committing := false
	err := durable(ctx, db, func(tx pgx.Tx) error {
		result, err := action(tx)
		if err != nil {
			return err
		}
		if err := record(ctx, tx, result); err != nil {
			return err
		}
		if beforeCommit != nil {
			beforeCommit()
		}
		committing = true
		return nil
	})
	if err == nil {
		return nil
	}
	verdict := "error: "
	if committing && commitOutcomeUnknown(err) {
		verdict = "unknown: "
		err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failureRecordTimeout)
	defer cancel()
	if rerr := durable(rctx, db, func(tx pgx.Tx) error {
		return record(rctx, tx, verdict+err.Error())
	}); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// durable runs f in a transaction that commits synchronously, whatever
// the session's synchronous_commit (the node's pool runs with it off).
func durable(ctx context.Context, db Beginner, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return fmt.Errorf("commit synchronously: %w", err)
		}
		return f(tx)
	})
}

// commitOutcomeUnknown tells, for an error of a transaction's COMMIT,
// whether the transaction may have committed: not when the server
// answered (a *pgconn.PgError: it rolled back), nor when nothing was sent
// (pgconn.SafeToRetry: a context already done, a connection already
// closed); otherwise the COMMIT may have reached the server and its
// answer was lost.
func commitOutcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	return !pgconn.SafeToRetry(err)
}
