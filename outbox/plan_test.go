package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// TestTriggerNeverScansTheOutbox: inserting a burst into an outbox whose
// statistics say it is empty (ANALYZE of the empty table) costs no
// sequential scan of the outbox. Before migration 0008 the key_seq
// trigger's cached plan scanned the whole table once per inserted row, so
// a burst took quadratic time.
func TestTriggerNeverScansTheOutbox(t *testing.T) {
	t.Parallel()
	pool, prod := setup(t, 2)
	ctx := testkit.Context(t, 60*time.Second)
	if _, err := pool.Exec(ctx, `ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	msgs := make([]outbox.Message, 2000)
	for i := range msgs {
		msgs[i] = msg(fmt.Sprintf("k%d", i%500))
	}
	var scans int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := prod.Enqueue(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_stat_get_xact_numscans('outbox'::regclass)`).Scan(&scans)
	})
	if err != nil {
		t.Fatal(err)
	}
	// A handful of scans come from planning in a fresh session; one per
	// row is the bug.
	if scans >= int64(len(msgs))/100 {
		t.Fatalf("inserting %d rows scanned the outbox sequentially %d times", len(msgs), scans)
	}
	t.Logf("%d sequential scans for %d rows", scans, len(msgs))
}
