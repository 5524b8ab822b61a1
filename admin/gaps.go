package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ErrNoGap is returned by FillGap when the key_seq it is given is not a
// gap of the key (it has a row, is beyond the key's counter, or is below
// what retention may have deleted).
var ErrNoGap = errors.New("not a key_seq gap")

// PlaceholderType is the AMQP type of the dead rows FillGap inserts; they
// are never published.
const PlaceholderType = "ordo.gap-placeholder"

// Gap is a key_seq of a key that no row holds, although nothing Ordo does
// (publishing, retention, purge) can have removed it: it was never
// inserted, or was deleted by hand. The key's next row would carry it as
// its x-ordo-prev-key-seq, and a consumer would wait for it forever,
// until FillGap puts a dead placeholder there.
//
// Gaps are found among the keys with pending rows and the keys whose
// counter is ahead of their highest row. A gap below every row of a key
// still present cannot be told from retention's deletions and is not
// reported.
type Gap struct {
	CorrelationID string `json:"correlationId"`
	KeySeq        int64  `json:"keySeq"`
	Partition     int    `json:"partition"`
	// NextKeySeq is the key's first row after the gap, 0 if there is none
	// yet (the key's next row will be the first after it).
	NextKeySeq int64 `json:"nextKeySeq"`
}

// ListGaps returns up to limit gaps, by key and key_seq.
func (s *Store) ListGaps(ctx context.Context, limit int) ([]Gap, error) {
	if s.sql.table {
		return nil, fmt.Errorf("gaps: %w: the owner numbers its rows", ErrNotSupported)
	}
	return listGaps(ctx, s.pool, nil, limit)
}

// maxGapsPerKey bounds the gaps of one key FillGap looks through.
const maxGapsPerKey = 100000

// FillGap inserts a dead placeholder row at key_seq keySeq of key, so
// that the x-ordo-prev-key-seq of the key's next message steps over it,
// as it does over a skipped message. It holds the key's counter lock
// while it checks that keySeq is a gap (else ErrNoGap; ErrNotFound for an
// unknown key) and inserts. It returns the placeholder's id.
func (s *Store) FillGap(ctx context.Context, who Actor, key string, keySeq int64) (uuid.UUID, error) {
	if s.sql.table {
		return uuid.Nil, fmt.Errorf("fill a gap: %w: the owner numbers its rows", ErrNotSupported)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return id, fmt.Errorf("placeholder id: %w", err)
	}
	target := fmt.Sprintf("key %q key_seq %d", key, keySeq)
	err = s.act(ctx, who, "fill-gap", target, func(tx pgx.Tx) (string, error) {
		var last int64
		if err := tx.QueryRow(ctx, sqlLockKey, key).Scan(&last); errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("%w: no key %q", ErrNotFound, key)
		} else if err != nil {
			return "", fmt.Errorf("lock key: %w", err)
		}
		gaps, err := listGaps(ctx, tx, &key, maxGapsPerKey)
		if err != nil {
			return "", err
		}
		i := slices.IndexFunc(gaps, func(g Gap) bool { return g.KeySeq == keySeq })
		if i < 0 {
			return "", fmt.Errorf("%w: key %q key_seq %d (the key's counter is at %d)", ErrNoGap, key, keySeq, last)
		}
		note := fmt.Sprintf("gap placeholder inserted by %s", who.Operator)
		if _, err := tx.Exec(ctx, sqlInsertPlaceholder, id, key, gaps[i].Partition, note, PlaceholderType); err != nil {
			return "", fmt.Errorf("insert placeholder: %w", err)
		}
		if _, err := tx.Exec(ctx, sqlPlaceKeySeq, id, key, keySeq); err != nil {
			return "", fmt.Errorf("move placeholder into the gap: %w", err)
		}
		return "placeholder " + id.String(), nil
	})
	return id, err
}

// querier runs a query: pgx.Tx and *pgxpool.Pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func listGaps(ctx context.Context, q querier, key *string, limit int) ([]Gap, error) {
	rows, err := q.Query(ctx, sqlListGaps, key, limit)
	if err != nil {
		return nil, fmt.Errorf("list key_seq gaps: %w", err)
	}
	gaps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Gap, error) {
		var g Gap
		var next *int64
		err := r.Scan(&g.CorrelationID, &g.KeySeq, &g.Partition, &next)
		if next != nil {
			g.NextKeySeq = *next
		}
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("list key_seq gaps: %w", err)
	}
	return gaps, nil
}
