package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

func setup(t *testing.T, conns int32) (*pgxpool.Pool, *outbox.Producer) {
	t.Helper()
	_, pool := testkit.NewDatabasePool(t, conns)
	ctx := testkit.Context(t, 30*time.Second)
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		t.Fatal(err)
	}
	p, err := outbox.NewProducer(64)
	if err != nil {
		t.Fatal(err)
	}
	return pool, p
}

func msg(key string) outbox.Message {
	return outbox.Message{CorrelationID: key, Exchange: "ex", RoutingKey: "rk", Type: "t.v1", Payload: json.RawMessage(`{"a":1}`)}
}

func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewDatabasePool(t, 8)
	ctx := testkit.Context(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- outbox.Migrate(ctx, pool, 64)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate: %v", err)
		}
	}
	if err := outbox.Migrate(ctx, pool, 64); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ordo_schema_migrations WHERE component = 'outbox'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no migration recorded")
	}
	if p, err := outbox.LoadPartitions(ctx, pool, 0); err != nil || p != 64 {
		t.Fatalf("LoadPartitions = %d, %v; want 64", p, err)
	}
}

func TestPartitionCountMismatch(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	err := outbox.Migrate(ctx, pool, 32)
	var mm *outbox.PartitionMismatchError
	if !errors.As(err, &mm) || !errors.Is(err, outbox.ErrPartitionMismatch) {
		t.Fatalf("Migrate with another P = %v, want PartitionMismatchError", err)
	}
	if mm.Installed != 64 || mm.Configured != 32 || !strings.Contains(err.Error(), "64") {
		t.Fatalf("error = %v", err)
	}
	if _, err := outbox.LoadPartitions(ctx, pool, 16); !errors.Is(err, outbox.ErrPartitionMismatch) {
		t.Fatalf("LoadPartitions(16) = %v", err)
	}
}

// enqueueWays are the two ways of writing messages: Enqueue through a
// transaction, and Queue on a batch sent on the pool (one implicit
// transaction).
var enqueueWays = []struct {
	name    string
	enqueue func(ctx context.Context, pool *pgxpool.Pool, p *outbox.Producer, msgs ...outbox.Message) ([]uuid.UUID, error)
}{
	{"Enqueue", func(ctx context.Context, pool *pgxpool.Pool, p *outbox.Producer, msgs ...outbox.Message) ([]uuid.UUID, error) {
		var ids []uuid.UUID
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			ids, err = p.Enqueue(ctx, tx, msgs...)
			return err
		})
		return ids, err
	}},
	{"Queue", func(ctx context.Context, pool *pgxpool.Pool, p *outbox.Producer, msgs ...outbox.Message) ([]uuid.UUID, error) {
		b := &pgx.Batch{}
		ids, err := p.Queue(ctx, b, msgs...)
		if err != nil {
			if b.Len() != 0 {
				return nil, fmt.Errorf("Queue failed (%w) and queued %d statements", err, b.Len())
			}
			return nil, err
		}
		if err := pool.SendBatch(ctx, b).Close(); err != nil {
			return nil, outbox.EnqueueError(len(msgs), err)
		}
		return ids, nil
	}},
}

func TestEnqueueAssignsIDPartitionKeySeq(t *testing.T) {
	t.Parallel()
	for _, way := range enqueueWays {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			testAssignsIDPartitionKeySeq(t, way.enqueue)
		})
	}
}

func testAssignsIDPartitionKeySeq(t *testing.T, enqueue func(context.Context, *pgxpool.Pool, *outbox.Producer, ...outbox.Message) ([]uuid.UUID, error)) {
	pool, p := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	m1 := msg("order-42")
	m1.Headers = map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": 3, "ok": true}
	ids, err := enqueue(ctx, pool, p, m1, msg("order-42"), msg("other"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, partition, correlation_id, key_seq, headers FROM outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id      uuid.UUID
		part    int
		key     string
		keySeq  int64
		headers map[string]any
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.id, &x.part, &x.key, &x.keySeq, &x.headers)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key    string
		keySeq int64
	}{{"order-42", 1}, {"order-42", 2}, {"other", 1}}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.id != ids[i] || g.id.Version() != 7 {
			t.Errorf("row %d id %v (v%d), want %v v7", i, g.id, g.id.Version(), ids[i])
		}
		if g.key != w.key || g.keySeq != w.keySeq || g.part != partition.Of(w.key, 64) {
			t.Errorf("row %d = %s/%d p%d, want %s/%d p%d", i, g.key, g.keySeq, g.part, w.key, w.keySeq, partition.Of(w.key, 64))
		}
	}
	if got[0].headers["traceparent"] == nil || got[0].headers["ok"] != true {
		t.Errorf("headers = %v", got[0].headers)
	}
}

func TestEnqueueRejectsInvalid(t *testing.T) {
	t.Parallel()
	pool, p := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	long := strings.Repeat("é", 128) // 256 bytes
	cases := []struct {
		name  string
		edit  func(m *outbox.Message)
		field string
	}{
		{"empty key", func(m *outbox.Message) { m.CorrelationID = "" }, "CorrelationID"},
		{"long key", func(m *outbox.Message) { m.CorrelationID = long }, "CorrelationID"},
		{"long exchange", func(m *outbox.Message) { m.Exchange = long }, "Exchange"},
		{"long routing key", func(m *outbox.Message) { m.RoutingKey = long }, "RoutingKey"},
		{"long type", func(m *outbox.Message) { m.Type = long }, "Type"},
		{"empty type", func(m *outbox.Message) { m.Type = "" }, "Type"},
		{"no payload", func(m *outbox.Message) { m.Payload = nil }, "Payload"},
		{"bad payload", func(m *outbox.Message) { m.Payload = json.RawMessage(`{`) }, "Payload"},
		{"header struct", func(m *outbox.Message) { m.Headers = map[string]any{"h": struct{}{}} }, "Headers[h]"},
		{"header nil", func(m *outbox.Message) { m.Headers = map[string]any{"h": nil} }, "Headers[h]"},
		{"header map", func(m *outbox.Message) { m.Headers = map[string]any{"h": map[string]any{}} }, "Headers[h]"},
		{"header reserved", func(m *outbox.Message) { m.Headers = map[string]any{"X-Ordo-Epoch": 1} }, "Headers[X-Ordo-Epoch]"},
		{"header long name", func(m *outbox.Message) { m.Headers = map[string]any{long: "v"} }, "Headers[" + long + "]"},
		{"headers over one frame", func(m *outbox.Message) {
			v := strings.Repeat("x", 60<<10)
			m.Headers = map[string]any{"a": v, "b": v, "c": v}
		}, "Headers"},
		{"header value over 64 KiB", func(m *outbox.Message) { m.Headers = map[string]any{"a": strings.Repeat("x", 65<<10)} }, "Headers[a]"},
	}
	for _, c := range cases {
		for _, way := range enqueueWays {
			t.Run(c.name+"/"+way.name, func(t *testing.T) {
				bad := msg("k")
				c.edit(&bad)
				_, err := way.enqueue(ctx, pool, p, msg("k"), bad)
				var me *outbox.MessageError
				if !errors.As(err, &me) || !errors.Is(err, outbox.ErrInvalidMessage) {
					t.Fatalf("err = %v, want MessageError", err)
				}
				if me.Index != 1 || me.Field != c.field {
					t.Fatalf("error names message %d field %q, want 1 %q: %v", me.Index, me.Field, c.field, err)
				}
			})
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("outbox rows = %d (%v), want 0", n, err)
	}
}

// TestConcurrentProducersOneKey: two transactions of one key get
// consecutive key_seq in commit order, even when the one that inserted
// first commits last... which the counter lock prevents: the second insert
// waits until the first transaction ends.
func TestConcurrentProducersOneKey(t *testing.T) {
	t.Parallel()
	pool, p := setup(t, 4)
	ctx := testkit.Context(t, 30*time.Second)

	txA, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	if _, err := p.Enqueue(ctx, txA, msg("hot")); err != nil {
		t.Fatal(err)
	}
	// B starts while A holds the key's counter row: it must wait for A.
	bDone := make(chan error, 1)
	var idB []uuid.UUID
	go func() {
		bDone <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			idB, err = p.Enqueue(ctx, tx, msg("hot"))
			return err
		})
	}()
	// Wait until B is really blocked on A's lock.
	testkit.WaitFor(t, 10*time.Second, "B waiting for A's lock", func() bool {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return waiting > 0
	})
	select {
	case err := <-bDone:
		t.Fatalf("B committed while A held the key: %v", err)
	default:
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	var seqB int64
	var occA, occB time.Time
	if err := pool.QueryRow(ctx, `SELECT key_seq, occurred_at FROM outbox WHERE id = $1`, idB[0]).Scan(&seqB, &occB); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT occurred_at FROM outbox WHERE correlation_id = 'hot' AND key_seq = 1`).Scan(&occA); err != nil {
		t.Fatal(err)
	}
	if seqB != 2 || !occB.After(occA) {
		t.Fatalf("B key_seq %d occurred %v, A occurred %v: want 2 and later", seqB, occB, occA)
	}

	// Many concurrent producers: key_seq is gap-free 1..n.
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := p.Enqueue(ctx, tx, msg("busy"))
				return err
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var count, lo, hi, distinct int64
	if err := pool.QueryRow(ctx, `SELECT count(*), min(key_seq), max(key_seq), count(DISTINCT key_seq)
		FROM outbox WHERE correlation_id = 'busy'`).Scan(&count, &lo, &hi, &distinct); err != nil {
		t.Fatal(err)
	}
	if count != n || lo != 1 || hi != n || distinct != n {
		t.Fatalf("busy key: count %d, key_seq %d..%d, distinct %d; want %d gap-free", count, lo, hi, distinct, n)
	}
	// Commit order = key_seq order = occurred_at order.
	var inversions int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox a JOIN outbox b
		ON a.correlation_id = b.correlation_id AND a.key_seq < b.key_seq AND a.occurred_at > b.occurred_at
		WHERE a.correlation_id = 'busy'`).Scan(&inversions); err != nil || inversions != 0 {
		t.Fatalf("occurred_at inversions = %d (%v)", inversions, err)
	}
}

func TestPlainInsertContract(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	insert := `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		VALUES ($1, $2, $3, 'ex', 'rk', 't', '{}')`
	id := uuid.Must(uuid.NewV7())
	if _, err := pool.Exec(ctx, insert, id, partition.Of("plain", 64), "plain"); err != nil {
		t.Fatal(err)
	}
	var keySeq int64
	var occurred time.Time
	if err := pool.QueryRow(ctx, `SELECT key_seq, occurred_at FROM outbox WHERE id = $1`, id).Scan(&keySeq, &occurred); err != nil {
		t.Fatal(err)
	}
	if keySeq != 1 || time.Since(occurred) > time.Minute || time.Since(occurred) < -time.Minute {
		t.Fatalf("plain insert got key_seq %d occurred_at %v", keySeq, occurred)
	}
	for _, c := range []struct {
		name       string
		part       int
		key        string
		constraint string
	}{
		{"partition too high", 64, "k", "outbox_partition_range"},
		{"partition negative", -1, "k", "outbox_partition_range"},
		{"key too long", 0, strings.Repeat("x", 256), "outbox_correlation_id_length"},
		{"key empty", 0, "", "outbox_correlation_id_length"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, insert, uuid.Must(uuid.NewV7()), c.part, c.key)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != c.constraint {
				t.Fatalf("err = %v, want check violation of %s", err, c.constraint)
			}
		})
	}
	long := strings.Repeat("e", 256)
	for _, c := range []struct {
		name, exchange, routingKey, typ, headers, constraint string
	}{
		{"long exchange", long, "rk", "t", `{}`, "outbox_exchange_length"},
		{"long routing key", "ex", long, "t", `{}`, "outbox_routing_key_length"},
		{"long type", "ex", "rk", long, `{}`, "outbox_type_length"},
		{"headers not an object", "ex", "rk", "t", `["a"]`, "outbox_headers_object"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, headers)
				VALUES ($1, 0, 'k-checks', $2, $3, $4, '{}', $5)`, uuid.Must(uuid.NewV7()), c.exchange, c.routingKey, c.typ, c.headers)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != c.constraint {
				t.Fatalf("err = %v, want check violation of %s", err, c.constraint)
			}
		})
	}
	// A refused row took no key_seq: the key's first row gets 1.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_keys WHERE correlation_id IN ('k', 'k-checks')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused rows left %d counter rows (%v)", n, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestRetriedInsertLeavesNoGap: an INSERT repeating an existing id (a
// producer's retry) is skipped and does not consume a key_seq.
func TestRetriedInsertLeavesNoGap(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, 2)
	ctx := testkit.Context(t, 30*time.Second)
	insert := `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
		VALUES ($1, $2, 'retry', 'ex', 'rk', 't', '{}') ON CONFLICT (id) DO NOTHING`
	p := partition.Of("retry", 64)
	first, second := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, id := range []uuid.UUID{first, first, first, second} {
		if _, err := pool.Exec(ctx, insert, id, p); err != nil {
			t.Fatal(err)
		}
	}
	var seqs []int64
	rows, err := pool.Query(ctx, `SELECT key_seq FROM outbox WHERE correlation_id = 'retry' ORDER BY key_seq`)
	if err != nil {
		t.Fatal(err)
	}
	seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(seqs) != 2 || seqs[0] != 1 || seqs[1] != 2 {
		t.Fatalf("key_seq after retried inserts: %v (%v), want [1 2]", seqs, err)
	}
}
