package pgstore_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// pgHarness is the PostgreSQL store on a database of its own, with rows
// written and leases claimed by plain SQL, as producers and the leaser do.
type pgHarness struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	// numbering: no key_seq trigger. Every partition starts held by n1
	// (only an owner numbers rows), and Skip numbers the row's key
	// first, as the owner's read of a row it then parks would have.
	numbering bool
}

func newPGHarness(t *testing.T) relaytest.StoreHarness {
	return newHarness(t, true)
}

// newNumberingHarness is newPGHarness without the producers' key_seq
// trigger: rows arrive without key_seq, and the Store numbers them.
func newNumberingHarness(t *testing.T) relaytest.StoreHarness {
	return newHarness(t, false)
}

func newHarness(t *testing.T, trigger bool) *pgHarness {
	_, pool := testkit.NewDatabasePool(t, 4)
	if err := outbox.Migrate(testkit.Context(t, 30*time.Second), pool, 8); err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(testkit.Context(t, 30*time.Second), pool, 8); err != nil {
		t.Fatal(err)
	}
	h := &pgHarness{pool: pool, store: pgstore.New(pool, "n1", nil), numbering: !trigger}
	if h.numbering {
		if err := outbox.DropKeySeqTrigger(testkit.Context(t, 30*time.Second), pool); err != nil {
			t.Fatal(err)
		}
		for p := range 8 {
			h.Grant(t, "n1", p)
		}
	}
	return h
}

func (h *pgHarness) Store() relay.Store { return h.store }

func (h *pgHarness) Insert(t testing.TB, partition int, keys ...string) []uuid.UUID {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	ids := make([]uuid.UUID, len(keys))
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		for i, k := range keys {
			ids[i] = uuid.Must(uuid.NewV7())
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
				VALUES ($1, $2, $3, 'ex', 'rk', 't', $4)`, ids[i], partition, k, json.RawMessage(`{}`)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func (h *pgHarness) Grant(t testing.TB, node string, partition int) int64 {
	t.Helper()
	var epoch int64
	err := h.pool.QueryRow(testkit.Context(t, 30*time.Second), `UPDATE ordo_leases
		SET owner = $1, epoch = epoch + 1, expires_at = clock_timestamp() + interval '1 hour', claimed_at = clock_timestamp()
		WHERE partition = $2 RETURNING epoch`, node, partition).Scan(&epoch)
	if err != nil {
		t.Fatal(err)
	}
	return epoch
}

func (h *pgHarness) Skip(t testing.TB, id uuid.UUID) {
	t.Helper()
	if h.numbering {
		_, err := h.pool.Exec(testkit.Context(t, 30*time.Second), `SELECT outbox_number_keys(l.owner, ARRAY[o.partition], ARRAY[o.correlation_id])
			FROM outbox AS o JOIN ordo_leases AS l USING (partition) WHERE o.id = $1`, id)
		if err != nil {
			t.Fatalf("number the key of %s: %v", id, err)
		}
	}
	tag, err := h.pool.Exec(testkit.Context(t, 30*time.Second), `UPDATE outbox
		SET dead_at = clock_timestamp(), processed_at = clock_timestamp(), parked_at = NULL, next_attempt_at = NULL
		WHERE id = $1 AND processed_at IS NULL`, id)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("skip %s: %v (%d rows)", id, err, tag.RowsAffected())
	}
}

// sqlRetryParked is an operator's retry of parked row $1: the columns
// the admin API's retry sets (admin/queries.go).
const sqlRetryParked = `UPDATE outbox SET parked_at = NULL, next_attempt_at = NULL, attempts = 0 WHERE id = $1 AND parked_at IS NOT NULL`

func (h *pgHarness) Retry(t testing.TB, id uuid.UUID) {
	t.Helper()
	tag, err := h.pool.Exec(testkit.Context(t, 30*time.Second), sqlRetryParked, id)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("retry %s: %v (%d rows)", id, err, tag.RowsAffected())
	}
}

func (h *pgHarness) State(t testing.TB, id uuid.UUID) relaytest.RowState {
	t.Helper()
	var s relaytest.RowState
	var lastErr *string
	err := h.pool.QueryRow(testkit.Context(t, 30*time.Second), `SELECT processed_at IS NOT NULL, parked_at IS NOT NULL,
		dead_at IS NOT NULL, attempts, last_error FROM outbox WHERE id = $1`, id).
		Scan(&s.Processed, &s.Parked, &s.Dead, &s.Attempts, &lastErr)
	if err != nil {
		t.Fatalf("state of %s: %v", id, err)
	}
	if lastErr != nil {
		s.LastError = *lastErr
	}
	return s
}

// TestConformance runs the relay.Store contract against PostgreSQL.
func TestConformance(t *testing.T) {
	testkit.RequirePostgres(t)
	relaytest.StoreSuite(t, newPGHarness)
}

// TestConformanceNumbering runs the relay.Store contract against
// PostgreSQL without the producers' key_seq trigger: the Store numbers
// the rows it reads.
func TestConformanceNumbering(t *testing.T) {
	testkit.RequirePostgres(t)
	relaytest.StoreSuite(t, newNumberingHarness)
}
