package orderapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/outage"
)

// IdempotencyKeyHeader is the request header that makes POST /orders safe
// to retry.
const IdempotencyKeyHeader = "Idempotency-Key"

// maxIdempotencyKeyBytes is the longest key accepted.
const maxIdempotencyKeyBytes = 255

// idempotencyKey returns r's Idempotency-Key, "" if it has none, or a 400
// if it has one that is empty, longer than 255 bytes, given twice, or not
// printable ASCII without spaces (a UUID is a good key).
func idempotencyKey(r *http.Request) (string, *requestError) {
	vals := r.Header.Values(IdempotencyKeyHeader)
	switch {
	case len(vals) == 0:
		return "", nil
	case len(vals) > 1:
		return "", badRequest("%s: given %d times, want one", IdempotencyKeyHeader, len(vals))
	}
	key := vals[0]
	if key == "" || len(key) > maxIdempotencyKeyBytes {
		return "", badRequest("%s: must be 1 to %d characters, got %d", IdempotencyKeyHeader, maxIdempotencyKeyBytes, len(key))
	}
	for i := range len(key) {
		if c := key[i]; c < '!' || c > '~' {
			return "", badRequest("%s: must be printable ASCII without spaces (a UUID, say), got %q", IdempotencyKeyHeader, truncate(key))
		}
	}
	return key, nil
}

// fingerprint is the SHA-256 of the order as validated, so that the same
// order sent with other whitespace, field order or number spelling
// ("12.5" or 12.50) is the same request.
func (o *order) fingerprint() []byte {
	type line struct {
		Book  uuid.UUID `json:"b"`
		Qty   int       `json:"q"`
		Price string    `json:"p"`
	}
	c := struct {
		Customer uuid.UUID `json:"c"`
		Currency string    `json:"cur"`
		Items    []line    `json:"i"`
	}{Customer: o.customerID, Currency: o.currency, Items: make([]line, len(o.items))}
	for i, it := range o.items {
		c.Items[i] = line{it.bookID, it.quantity, it.unitPrice}
	}
	b, _ := json.Marshal(c) // cannot fail: plain strings, ints and UUIDs
	sum := sha256.Sum256(b)
	return sum[:]
}

// keyTaken is returned, to roll back, by a transaction that found its
// idempotency key already used by a committed order.
type keyTaken struct {
	orderID  uuid.UUID
	total    string
	sameBody bool
}

func (e *keyTaken) Error() string {
	return fmt.Sprintf("idempotency key already used by order %s", e.orderID)
}

// claimKey takes key for order id in tx. If a committed, unexpired order
// holds it already, it returns a *keyTaken describing that order. A
// concurrent request with the same key waits in the INSERT until the
// first one ends, so it sees that order or, if it rolled back, takes the
// key itself.
func (s *Server) claimKey(ctx context.Context, tx pgx.Tx, key string, hash []byte, id uuid.UUID) error {
	ttl := s.cfg.IdempotencyKeyTTL.Seconds()
	for attempt := 1; ; attempt++ {
		var claimed bool
		err := tx.QueryRow(ctx, sqlClaimIdempotencyKey, key, hash, id, ttl).Scan(&claimed)
		if err == nil {
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("claim idempotency key: %w", err)
		}
		taken := &keyTaken{}
		var (
			storedHash []byte
			currency   string
		)
		err = tx.QueryRow(ctx, sqlSelectIdempotencyKey, key).Scan(&storedHash, &taken.orderID, &currency, &taken.total)
		if errors.Is(err, pgx.ErrNoRows) && attempt < 3 {
			continue // expired and deleted between the two statements: claim again
		}
		if err != nil {
			return fmt.Errorf("read idempotency key: %w", err)
		}
		if digits, ok := MinorDigits(currency); ok {
			taken.total = normalizeAmount(taken.total, digits)
		}
		taken.sameBody = bytes.Equal(storedHash, hash)
		return taken
	}
}

// replay answers a request whose idempotency key is taken: the first
// order's answer for the same body, 422 for another.
func replay(w http.ResponseWriter, taken *keyTaken) {
	if !taken.sameBody {
		writeError(w, http.StatusUnprocessableEntity,
			fmt.Sprintf("%s: already used for another request body (order %s); use a new key for a new order", IdempotencyKeyHeader, taken.orderID))
		return
	}
	w.Header().Set("Location", "/orders/"+taken.orderID.String())
	w.Header().Set("Idempotent-Replayed", "true")
	writeJSON(w, http.StatusCreated, placedResponse{ID: taken.orderID.String(), Total: taken.total})
}

// keyExpiryChunk is the most keys one DELETE of ExpireKeys removes.
const keyExpiryChunk = 1000

// ExpireKeys deletes the idempotency keys older than
// Config.IdempotencyKeyTTL, in chunks, and returns how many it deleted.
// Keys a request holds are left for the next run.
func (s *Server) ExpireKeys(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, sqlExpireIdempotencyKeys, s.cfg.IdempotencyKeyTTL.Seconds(), keyExpiryChunk)
		if err != nil {
			return total, fmt.Errorf("expire idempotency keys: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < keyExpiryChunk {
			return total, nil
		}
	}
}

// RunKeyExpiry calls ExpireKeys every Config.KeyExpiryInterval until ctx
// ends, then returns nil. Failures are logged once per outage, not per
// attempt. The caller owns the goroutine that runs it and waits for it
// before closing the pool.
func (s *Server) RunKeyExpiry(ctx context.Context) error {
	down := outage.New(s.logger, "PostgreSQL (idempotency key expiry)")
	t := time.NewTicker(s.cfg.KeyExpiryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := s.ExpireKeys(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			down.Fail(err)
			continue
		}
		down.OK()
		if n > 0 {
			s.logger.Debug("expired idempotency keys", "keys", n)
		}
	}
}
