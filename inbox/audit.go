package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/opaudit"
)

// Actor is who asks for an operator action, for the audit trail.
type Actor struct {
	Operator   string // a person's or tool's name
	RemoteAddr string // where the request came from ("cli" for the command line)
}

// Action is an operator action on a key: ActionResolve, ActionRetry or
// ActionSkip.
type Action string

// The operator actions, as Act takes them and ordo_inbox_audit records
// them.
const (
	ActionResolve Action = "resolve" // Resolve: a stuck key's missing messages skipped
	ActionRetry   Action = "retry"   // Retry: a dead-lettered message gets new attempts
	ActionSkip    Action = "skip"    // Skip: a dead-lettered message dropped, the key goes on
)

// ParseAction returns the Action named s, or an error naming the valid
// ones.
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case ActionResolve, ActionRetry, ActionSkip:
		return a, nil
	}
	return "", fmt.Errorf("unknown action %q (want resolve, retry or skip)", s)
}

// AuditEntry is one row of ordo_inbox_audit.
type AuditEntry struct {
	ID         int64     `json:"id"`
	At         time.Time `json:"at"`
	Operator   string    `json:"operator"`
	RemoteAddr string    `json:"remoteAddr"`
	Action     Action    `json:"action"`
	Source     string    `json:"source"` // the key's source
	Key        string    `json:"key"`
	Result     string    `json:"result"` // "done"; "error: ..." when the action was refused or failed; "unknown: ..." when its COMMIT got no answer
}

const (
	sqlAuditInsert = `
INSERT INTO ordo_inbox_audit (consumer, operator, remote_addr, action, key, result, source)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

	sqlAuditList = `
SELECT id, at, operator, remote_addr, action, source, key, result FROM ordo_inbox_audit
WHERE consumer = $1 ORDER BY id DESC LIMIT $2`
)

// Act runs action (Resolve, Retry or Skip) on consumer's key of source and records
// it in ordo_inbox_audit with who asked and its result, whatever the
// outcome (internal/opaudit): a successful action and its record commit
// together (durably, whatever the session's synchronous_commit); a
// refused or failed one rolls back and "error: …" is recorded on its own;
// one whose COMMIT got no answer is recorded as "unknown: …" and returns
// ErrOutcomeUnknown. It returns the action's error (wrapping
// ErrNothingToResolve when there was nothing to act on), joined with the
// audit's if that failed too.
func Act(ctx context.Context, db TxBeginner, who Actor, action Action, consumer, source, key string) error {
	run := map[Action]func(context.Context, DB, string, string, string) error{
		ActionResolve: Resolve, ActionRetry: Retry, ActionSkip: Skip}[action]
	if run == nil {
		_, err := ParseAction(string(action))
		return err
	}
	return opaudit.Run(ctx, db, func(tx pgx.Tx) (string, error) {
		return "done", run(ctx, tx, consumer, source, key)
	}, func(ctx context.Context, tx pgx.Tx, result string) error {
		return audit(ctx, tx, who, action, consumer, source, key, result)
	}, nil)
}

// Audit returns consumer's last limit operator actions, newest first.
func Audit(ctx context.Context, db DB, consumer string, limit int) ([]AuditEntry, error) {
	rows, err := db.Query(ctx, sqlAuditList, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("list operator actions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		return a, r.Scan(&a.ID, &a.At, &a.Operator, &a.RemoteAddr, &a.Action, &a.Source, &a.Key, &a.Result)
	})
	if err != nil {
		return nil, fmt.Errorf("list operator actions: %w", err)
	}
	return out, nil
}

func audit(ctx context.Context, tx pgx.Tx, who Actor, action Action, consumer, source, key, result string) error {
	if _, err := tx.Exec(ctx, sqlAuditInsert, consumer, who.Operator, who.RemoteAddr, string(action), key, result, source); err != nil {
		return fmt.Errorf("record operator action: %w", err)
	}
	return nil
}
