package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrNoFilter is returned by RetryMatching without any filter: a bulk
// retry of every parked message must be asked for by name, not by
// omission.
var ErrNoFilter = errors.New("bulk retry needs an error substring, a key prefix, or both")

// Filter selects parked messages for a bulk retry. Both fields set select
// messages matching both.
type Filter struct {
	// ErrorContains matches a substring of the message's last error.
	ErrorContains string `json:"errorContains,omitempty"`
	// KeyPrefix matches the start of the correlation id.
	KeyPrefix string `json:"keyPrefix,omitempty"`
}

// sqlRetryMatching retries every parked message whose last error holds $1
// (if not null) and whose key starts with $2 (if not null).
const sqlRetryMatching = `
UPDATE outbox SET parked_at = NULL, next_attempt_at = NULL, attempts = 0
WHERE parked_at IS NOT NULL AND processed_at IS NULL
  AND ($1::text IS NULL OR strpos(coalesce(last_error, ''), $1) > 0)
  AND ($2::text IS NULL OR starts_with(correlation_id, $2))
RETURNING partition`

// RetryMatching retries every parked message f selects, in one
// transaction with its audit row, and returns how many it retried (0 is
// not an error).
func (s *Store) RetryMatching(ctx context.Context, who Actor, f Filter) (int, error) {
	if f.ErrorContains == "" && f.KeyPrefix == "" {
		return 0, ErrNoFilter
	}
	var n int
	target := fmt.Sprintf("error contains %q, key prefix %q", f.ErrorContains, f.KeyPrefix)
	err := s.act(ctx, who, "retry-bulk", target, func(tx pgx.Tx) (string, error) {
		rows, err := tx.Query(ctx, s.sql.retryMatching, nullIfEmpty(f.ErrorContains), nullIfEmpty(f.KeyPrefix))
		if err != nil {
			return "", err
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return "", err
		}
		n = len(parts)
		return fmt.Sprintf("retried %d", n), s.notify(ctx, tx, distinct(parts)...)
	})
	return n, err
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func distinct(ps []int32) []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, p := range ps {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// retryBulk serves POST /admin/retry with a Filter as its body.
func (h *handler) retryBulk(w http.ResponseWriter, r *http.Request, who Actor) {
	var f Filter
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeErr(w, http.StatusBadRequest, `body: want {"errorContains": "...", "keyPrefix": "..."}: `+err.Error())
		return
	}
	f.ErrorContains, f.KeyPrefix = strings.TrimSpace(f.ErrorContains), strings.TrimSpace(f.KeyPrefix)
	n, err := h.store.RetryMatching(r.Context(), who, f)
	if errors.Is(err, ErrNoFilter) {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	h.done(w, err, map[string]any{"retried": n, "filter": f})
}
