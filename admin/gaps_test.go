package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// keyRows writes n rows of key and returns their ids by key_seq (index 0
// is key_seq 1).
func keyRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, prod *outbox.Producer, key string, n int) []string {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{CorrelationID: key, Exchange: "ex", RoutingKey: "rk", Type: "t", Payload: json.RawMessage(`{}`)}
	}
	var ids []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err := prod.Enqueue(ctx, tx, msgs...)
		for _, id := range got {
			ids = append(ids, id.String())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestGaps: gaps are found where nothing Ordo does can have removed a row,
// and not where retention or purge may have; FillGap puts a dead
// placeholder in one, under the key's lock, and refuses anything else.
func TestGaps(t *testing.T) {
	t.Parallel()
	ob := testkit.NewOutbox(t, 16, 3)
	pool, prod := ob.Pool, ob.Producer
	ctx := testkit.Context(t, 30*time.Second)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const published = `UPDATE outbox SET processed_at = now() WHERE correlation_id = $1 AND key_seq = ANY($2::bigint[])`
	const dead = `UPDATE outbox SET processed_at = now(), dead_at = now() WHERE correlation_id = $1 AND key_seq = ANY($2::bigint[])`
	const remove = `DELETE FROM outbox WHERE correlation_id = $1 AND key_seq = ANY($2::bigint[])`

	// Not gaps: published rows retention deleted, before a new row.
	keyRows(t, ctx, pool, prod, "retained", 4)
	exec(published, "retained", []int64{1, 2, 3})
	exec(remove, "retained", []int64{1, 2, 3})
	// Not gaps: a dead row kept, the published row after it retained, a
	// pending row.
	keyRows(t, ctx, pool, prod, "dead-kept", 3)
	exec(dead, "dead-kept", []int64{1})
	exec(published, "dead-kept", []int64{2})
	exec(remove, "dead-kept", []int64{2})
	// Not gaps: everything retained, the counter ahead of nothing.
	keyRows(t, ctx, pool, prod, "all-gone", 3)
	exec(published, "all-gone", []int64{1, 2, 3})
	exec(remove, "all-gone", []int64{1, 2, 3})
	// Gap: above a published row still present, below a pending one.
	keyRows(t, ctx, pool, prod, "above-published", 4)
	exec(published, "above-published", []int64{1, 2})
	exec(remove, "above-published", []int64{3})
	// Gap: between two pending rows (the first parked, say).
	keyRows(t, ctx, pool, prod, "between-pending", 3)
	exec(remove, "between-pending", []int64{2})
	// Gap: the counter ahead of the key's highest row.
	keyRows(t, ctx, pool, prod, "counter-ahead", 3)
	exec(published, "counter-ahead", []int64{1, 2})
	exec(remove, "counter-ahead", []int64{3})

	// Rows the owner numbered in its journal (outbox_numbers) and has not
	// marked yet: their key_seq is not in the row. Not gaps; a row deleted
	// below one is.
	const journal = `WITH r AS (
		    SELECT id, partition, correlation_id, key_seq FROM outbox WHERE correlation_id = $1 AND key_seq = ANY($2::bigint[])),
		j AS (INSERT INTO outbox_numbers (id, partition, correlation_id, key_seq) SELECT * FROM r)
		UPDATE outbox AS o SET key_seq = NULL FROM r WHERE o.id = r.id`
	keyRows(t, ctx, pool, prod, "journaled", 3)
	exec(published, "journaled", []int64{1})
	exec(journal, "journaled", []int64{2, 3})
	keyRows(t, ctx, pool, prod, "below-journaled", 3)
	exec(published, "below-journaled", []int64{1})
	exec(remove, "below-journaled", []int64{2})
	exec(journal, "below-journaled", []int64{3})
	// A journaled row deleted by hand leaves its entry behind: still a gap.
	const removeJournaled = `DELETE FROM outbox AS o USING outbox_numbers AS n
		WHERE n.id = o.id AND n.correlation_id = $1 AND n.key_seq = ANY($2::bigint[])`
	keyRows(t, ctx, pool, prod, "journaled-deleted", 3)
	exec(published, "journaled-deleted", []int64{1})
	exec(journal, "journaled-deleted", []int64{2, 3})
	exec(removeJournaled, "journaled-deleted", []int64{2})
	// Published rows whose numbers stay in the journal (the mark leaves
	// them there), the ones retention deleted gone with their entries:
	// not gaps; a journaled row deleted by hand above them is.
	const publishJournaled = `UPDATE outbox AS o SET processed_at = now() FROM outbox_numbers AS n
		WHERE n.id = o.id AND n.correlation_id = $1 AND n.key_seq = ANY($2::bigint[])`
	const retainJournaled = `WITH d AS (DELETE FROM outbox AS o USING outbox_numbers AS n
		WHERE n.id = o.id AND n.correlation_id = $1 AND n.key_seq = ANY($2::bigint[]) RETURNING o.id)
		DELETE FROM outbox_numbers WHERE id IN (SELECT id FROM d)`
	keyRows(t, ctx, pool, prod, "published-journaled", 6)
	exec(journal, "published-journaled", []int64{1, 2, 3, 4, 5, 6})
	exec(publishJournaled, "published-journaled", []int64{1, 2, 3, 4})
	exec(retainJournaled, "published-journaled", []int64{1, 2})
	exec(removeJournaled, "published-journaled", []int64{5})
	keyRows(t, ctx, pool, prod, "journaled-top-deleted", 3)
	exec(published, "journaled-top-deleted", []int64{1, 2})
	exec(journal, "journaled-top-deleted", []int64{3})
	exec(removeJournaled, "journaled-top-deleted", []int64{3})

	store := admin.NewStore(pool)
	gaps, err := store.ListGaps(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []admin.Gap{
		{CorrelationID: "above-published", KeySeq: 3, NextKeySeq: 4},
		{CorrelationID: "below-journaled", KeySeq: 2, NextKeySeq: 3},
		{CorrelationID: "between-pending", KeySeq: 2, NextKeySeq: 3},
		{CorrelationID: "counter-ahead", KeySeq: 3, NextKeySeq: 0},
		{CorrelationID: "journaled-deleted", KeySeq: 2, NextKeySeq: 3},
		{CorrelationID: "journaled-top-deleted", KeySeq: 3, NextKeySeq: 0},
		{CorrelationID: "published-journaled", KeySeq: 5, NextKeySeq: 6},
	}
	if len(gaps) != len(want) {
		t.Fatalf("gaps %+v, want %+v", gaps, want)
	}
	for i, g := range gaps {
		g.Partition = 0
		if g != want[i] {
			t.Fatalf("gap %d = %+v, want %+v (all: %+v)", i, g, want[i], gaps)
		}
	}

	who := admin.Actor{Operator: "alice", RemoteAddr: "test"}
	for _, c := range []struct {
		key  string
		seq  int64
		want error
	}{
		{"ghost", 1, admin.ErrNotFound},
		{"retained", 2, admin.ErrNoGap},        // retention may have deleted it
		{"above-published", 4, admin.ErrNoGap}, // has a row
		{"above-published", 5, admin.ErrNoGap}, // beyond the counter
	} {
		if _, err := store.FillGap(ctx, who, c.key, c.seq); !errors.Is(err, c.want) {
			t.Errorf("FillGap(%s, %d) = %v, want %v", c.key, c.seq, err, c.want)
		}
	}
	for _, g := range want {
		id, err := store.FillGap(ctx, who, g.CorrelationID, g.KeySeq)
		if err != nil {
			t.Fatalf("FillGap(%s, %d): %v", g.CorrelationID, g.KeySeq, err)
		}
		var seq, last int64
		var typ string
		var isDead bool
		err = pool.QueryRow(ctx, `SELECT o.key_seq, o.type, o.dead_at IS NOT NULL AND o.processed_at IS NOT NULL, k.last_key_seq
			FROM outbox o JOIN outbox_keys k USING (correlation_id) WHERE o.id = $1`, id).Scan(&seq, &typ, &isDead, &last)
		if err != nil || seq != g.KeySeq || typ != admin.PlaceholderType || !isDead {
			t.Fatalf("placeholder of %s: key_seq %d type %q dead %v (%v)", g.CorrelationID, seq, typ, isDead, err)
		}
		wantLast := max(g.KeySeq, g.NextKeySeq)
		if last != wantLast {
			t.Fatalf("%s: counter at %d after the fill, want %d (unchanged)", g.CorrelationID, last, wantLast)
		}
	}
	if gaps, err := store.ListGaps(ctx, 100); err != nil || len(gaps) != 0 {
		t.Fatalf("gaps after filling: %+v (%v)", gaps, err)
	}
	// A filled number's journal entry, whose row was gone, goes with the fill.
	var orphans int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_numbers AS n WHERE NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.id = n.id)`).
		Scan(&orphans); err != nil || orphans != 0 {
		t.Fatalf("%d journal entries without a row after filling (%v); want none", orphans, err)
	}
	// The next row of a filled key continues the counter.
	keyRows(t, ctx, pool, prod, "counter-ahead", 1)
	var top int64
	if err := pool.QueryRow(ctx, `SELECT max(key_seq) FROM outbox WHERE correlation_id = 'counter-ahead'`).Scan(&top); err != nil || top != 4 {
		t.Fatalf("next row of counter-ahead got key_seq %d (%v), want 4", top, err)
	}
	var audited int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ordo_operator_audit WHERE action = 'fill-gap' AND operator = 'alice'`).Scan(&audited); err != nil || audited != 4+len(want) {
		t.Fatalf("%d fill-gap actions audited (%v), want %d (4 refused, %d filled)", audited, err, 4+len(want), len(want))
	}
}

// leanOutbox is an outbox of its own without the key_seq trigger (the
// partition owner numbers rows), and a context for the test.
func leanOutbox(t *testing.T) (*pgxpool.Pool, context.Context) {
	t.Helper()
	pool := testkit.NewOutbox(t, 16, 3).Pool
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `DROP TRIGGER outbox_assign_key_seq ON outbox`); err != nil {
		t.Fatal(err)
	}
	return pool, ctx
}

// TestFillGapWithoutTheTrigger: with the key_seq trigger dropped (the
// partition owner numbers rows), the placeholder's insert takes no number
// from the key's counter, so the fill gives none back: the counter stays
// where it was, and the owner's next number for the key is not one a row
// already holds.
func TestFillGapWithoutTheTrigger(t *testing.T) {
	t.Parallel()
	pool, ctx := leanOutbox(t)
	// Rows the owner numbered: 1 published, 2 deleted by hand, 3 pending.
	if _, err := pool.Exec(ctx, `
		WITH k AS (INSERT INTO outbox_keys (correlation_id, last_key_seq, partition) VALUES ('lean', 3, 5))
		INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, processed_at)
		VALUES (gen_random_uuid(), 5, 'lean', 1, 'ex', 'rk', 't', '{}', now()),
		       (gen_random_uuid(), 5, 'lean', 3, 'ex', 'rk', 't', '{}', NULL)`); err != nil {
		t.Fatal(err)
	}
	store := admin.NewStore(pool)
	id, err := store.FillGap(ctx, admin.Actor{Operator: "alice", RemoteAddr: "test"}, "lean", 2)
	if err != nil {
		t.Fatal(err)
	}
	var seq, last int64
	if err := pool.QueryRow(ctx, `SELECT o.key_seq, k.last_key_seq FROM outbox o JOIN outbox_keys k USING (correlation_id) WHERE o.id = $1`, id).
		Scan(&seq, &last); err != nil || seq != 2 || last != 3 {
		t.Fatalf("placeholder key_seq %d, counter %d (%v); want 2 and 3 (unchanged)", seq, last, err)
	}
}

// TestListParkedCountsJournaledRows: without the trigger, the rows behind
// a parked row that the owner numbered into its journal (read, not held
// yet) count as waiting, as rows numbered in the row do.
func TestListParkedCountsJournaledRows(t *testing.T) {
	t.Parallel()
	pool, ctx := leanOutbox(t)
	// 1 parked (its number in the row, as a park writes it), 2 held (in
	// the row), 3 and 4 numbered into the journal, 5 published, 6 not
	// numbered yet.
	if _, err := pool.Exec(ctx, `
		WITH k AS (INSERT INTO outbox_keys (correlation_id, last_key_seq, partition) VALUES ('lean', 5, 5)),
		r AS (INSERT INTO outbox (id, partition, correlation_id, key_seq, exchange, routing_key, type, payload, parked_at, held_behind, processed_at)
		VALUES (gen_random_uuid(), 5, 'lean', 1, 'ex', 'rk', 't', '{}', now(), NULL, NULL),
		       (gen_random_uuid(), 5, 'lean', 2, 'ex', 'rk', 't', '{}', NULL, 1, NULL),
		       ('00000000-0000-0000-0000-000000000003', 5, 'lean', NULL, 'ex', 'rk', 't', '{}', NULL, NULL, NULL),
		       ('00000000-0000-0000-0000-000000000004', 5, 'lean', NULL, 'ex', 'rk', 't', '{}', NULL, NULL, NULL),
		       ('00000000-0000-0000-0000-000000000005', 5, 'lean', NULL, 'ex', 'rk', 't', '{}', NULL, NULL, now()),
		       (gen_random_uuid(), 5, 'lean', NULL, 'ex', 'rk', 't', '{}', NULL, NULL, NULL))
		INSERT INTO outbox_numbers (id, partition, correlation_id, key_seq)
		VALUES ('00000000-0000-0000-0000-000000000003', 5, 'lean', 3),
		       ('00000000-0000-0000-0000-000000000004', 5, 'lean', 4),
		       ('00000000-0000-0000-0000-000000000005', 5, 'lean', 5)`); err != nil {
		t.Fatal(err)
	}
	list, err := admin.NewStore(pool).ListParked(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].CorrelationID != "lean" || list[0].Waiting != 3 {
		t.Fatalf("parked %+v; want key lean with 3 waiting (2 in the row, 3 and 4 in the journal)", list)
	}
}
