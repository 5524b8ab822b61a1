// Package admin is the operator's side of Ordo: list parked messages,
// retry or skip them, purge dead rows. Every action is recorded in
// ordo_operator_audit with the operator's name, the caller's address, the
// action, its target and the result. The HTTP handler serves the same
// actions behind a bearer token. It owns no table: the outbox rows, the
// key counters and ordo_operator_audit are package outbox's, and it wakes
// relays on outbox.NotifyChannel. NewTableStore acts the same way on the
// rows a node took in from an adopted table (relay/tablesource's
// ordo_table_rows, and the user's table for a skip), and wakes relays on
// tablesource.NotifyChannel.
package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/opaudit"
)

// ErrNotFound is returned when no outbox row has the given id (or no
// parked row has the given key).
var ErrNotFound = errors.New("no such message")

// ErrNotParked is returned by Retry and Skip for a message that is not
// parked: only parked messages can be retried or skipped (a pending one may
// be in flight right now).
var ErrNotParked = errors.New("message is not parked")

// ErrNotSupported is returned by the actions that only Ordo's own outbox
// has (purge, the gap list and fill) on a Store over an adopted table.
var ErrNotSupported = errors.New("not supported for an adopted table")

// ErrOutcomeUnknown is returned when the connection failed while an
// action was committing: the COMMIT was sent and no answer came, so the
// action may have taken effect (with its own audit row) or not. Look at
// the message, or the audit, before asking again; a retry or skip asked
// again is refused with ErrNotParked if the first one took effect.
var ErrOutcomeUnknown = opaudit.ErrOutcomeUnknown

// Actor is who asks for an action, for the audit trail.
type Actor struct {
	Operator   string // a person's or tool's name
	RemoteAddr string // where the request came from
}

// Parked is one parked message and what waits behind it.
type Parked struct {
	ID            uuid.UUID `json:"id"`
	Partition     int       `json:"partition"`
	CorrelationID string    `json:"correlationId"`
	KeySeq        int64     `json:"keySeq"`
	Exchange      string    `json:"exchange"`
	RoutingKey    string    `json:"routingKey"`
	Type          string    `json:"type"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"lastError"`
	ParkedAt      time.Time `json:"parkedAt"`
	// Waiting is the number of later messages of the key held behind
	// it: the pending rows numbered after it, their number in the row or
	// in the owner's journal. Rows not numbered yet (not read by the
	// partition's owner since they arrived) are not counted.
	Waiting int64 `json:"waiting"`
}

// Store runs operator actions against the outbox database. Safe for
// concurrent use.
type Store struct {
	pool *pgxpool.Pool
	sql  statements

	// beforeCommit, when set (tests only), runs after an action and its
	// audit row are written and before the transaction commits.
	beforeCommit func()
}

// NewStore returns a Store on the outbox database pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool, sql: outboxStatements} }

// ListParked returns up to limit parked messages, oldest first.
func (s *Store) ListParked(ctx context.Context, limit int) ([]Parked, error) {
	rows, err := s.pool.Query(ctx, s.sql.listParked, limit)
	if err != nil {
		return nil, fmt.Errorf("list parked messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Parked, error) {
		var p Parked
		var lastErr *string
		err := r.Scan(&p.ID, &p.Partition, &p.CorrelationID, &p.KeySeq, &p.Exchange, &p.RoutingKey, &p.Type,
			&p.Attempts, &lastErr, &p.ParkedAt, &p.Waiting)
		if lastErr != nil {
			p.LastError = *lastErr
		}
		if p.Exchange == "" {
			p.Exchange = s.sql.exchange
		}
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list parked messages: %w", err)
	}
	return out, nil
}

// Retry puts a parked message back at the head of its key with a fresh
// attempt count.
func (s *Store) Retry(ctx context.Context, who Actor, id uuid.UUID) error {
	return s.act(ctx, who, "retry", "message "+id.String(), func(tx pgx.Tx) (string, error) {
		return "retried", s.onParked(ctx, tx, s.sql.retry, id)
	})
}

// RetryKey retries the parked message of key, and returns how many it
// retried (0 or 1: only a key's head can be parked).
func (s *Store) RetryKey(ctx context.Context, who Actor, key string) (int, error) {
	var n int
	err := s.act(ctx, who, "retry-key", "key "+key, func(tx pgx.Tx) (string, error) {
		rows, err := tx.Query(ctx, s.sql.retryKey, key)
		if err != nil {
			return "", err
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return "", err
		}
		if len(parts) == 0 {
			return "", fmt.Errorf("%w: no parked message for key %q", ErrNotFound, key)
		}
		n = len(parts)
		return fmt.Sprintf("retried %d", n), s.notify(ctx, tx, parts...)
	})
	return n, err
}

// Skip marks a parked message dead: it is never published, and its key
// goes on; the next message's x-ordo-prev-key-seq shows the skip. On an
// adopted table it also sets the user's row's processed-at, as a
// published row's is.
func (s *Store) Skip(ctx context.Context, who Actor, id uuid.UUID) error {
	return s.act(ctx, who, "skip", "message "+id.String(), func(tx pgx.Tx) (string, error) {
		return "skipped", s.onParked(ctx, tx, s.sql.skip, id)
	})
}

// Purge deletes dead rows whose key has no later pending row and has a
// later row already published (so every future message's
// x-ordo-prev-key-seq is still computed right), and returns how many.
func (s *Store) Purge(ctx context.Context, who Actor) (int64, error) {
	if s.sql.table {
		return 0, fmt.Errorf("purge: %w: retention deletes its dead rows", ErrNotSupported)
	}
	var n int64
	err := s.act(ctx, who, "purge", "dead rows", func(tx pgx.Tx) (string, error) {
		tag, err := tx.Exec(ctx, sqlPurge)
		n = tag.RowsAffected()
		return fmt.Sprintf("purged %d", n), err
	})
	return n, err
}

// onParked runs one of the parked-only updates on id, telling a missing
// row from one that is not parked.
func (s *Store) onParked(ctx context.Context, tx pgx.Tx, sql string, id uuid.UUID) error {
	var part int32
	err := tx.QueryRow(ctx, sql, id).Scan(&part)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := tx.QueryRow(ctx, s.sql.exists, id).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return fmt.Errorf("%w: %s", ErrNotParked, id)
		}
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return err
	}
	return s.notify(ctx, tx, part)
}

// notify wakes the relays of partitions when tx commits, on the channel
// they listen to (the outbox's, or the adopted table's): each reads the
// partition again at once.
func (s *Store) notify(ctx context.Context, tx pgx.Tx, partitions ...int32) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, p::text) FROM unnest($2::int[]) AS p`, s.sql.channel, partitions)
	return err
}

// act runs f and records the action in ordo_operator_audit, whatever its
// outcome (internal/opaudit): f's own result when it commits, "error: …"
// when it surely did not, "unknown: …" with ErrOutcomeUnknown when the
// connection failed during the COMMIT.
func (s *Store) act(ctx context.Context, who Actor, action, target string, f func(pgx.Tx) (string, error)) error {
	return opaudit.Run(ctx, s.pool, f, func(ctx context.Context, tx pgx.Tx, result string) error {
		return audit(ctx, tx, who, action, target, result)
	}, s.beforeCommit)
}

// execer runs a statement: pgx.Tx and *pgxpool.Pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func audit(ctx context.Context, db execer, who Actor, action, target, result string) error {
	if _, err := db.Exec(ctx, sqlAudit, who.Operator, who.RemoteAddr, action, target, result); err != nil {
		return fmt.Errorf("record operator action: %w", err)
	}
	return nil
}
