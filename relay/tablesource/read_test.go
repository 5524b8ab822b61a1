package tablesource_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

const sqlInsert = `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt", "ProcessedAt")
VALUES ($1, $2, $3, $4, $5, $6, $7)`

func articleDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	_, pool := testkit.NewDatabasePool(t, 4)
	if _, err := pool.Exec(context.Background(), tablesource.ArticleDDL); err != nil {
		t.Fatalf("create the article's table: %v", err)
	}
	return pool
}

// msg is one row to insert.
type msg struct {
	id        uuid.UUID
	corr      *string
	at        time.Time
	payload   string
	processed bool
}

func insert(t *testing.T, pool *pgxpool.Pool, ms ...msg) {
	t.Helper()
	for _, m := range ms {
		var processed *time.Time
		if m.processed {
			now := time.Now()
			processed = &now
		}
		payload := m.payload
		if payload == "" {
			payload = `{"orderId": 1}`
		}
		if _, err := pool.Exec(context.Background(), sqlInsert, m.id, "OrderPlaced", "order.placed", payload, m.corr, m.at, processed); err != nil {
			t.Fatalf("insert %s: %v", m.id, err)
		}
	}
}

func ptr(s string) *string { return &s }

func TestCheckArticleTable(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := articleDB(t)
	ctx := context.Background()
	if err := tablesource.Check(ctx, pool, tablesource.Article()); err != nil {
		t.Fatalf("Check(article) on the article's table: %v", err)
	}

	l := tablesource.Article()
	l.Table = "outboxmessages"
	if err := tablesource.Check(ctx, pool, l); !errors.Is(err, tablesource.ErrInvalidLayout) || !strings.Contains(err.Error(), `"outboxmessages" does not exist`) {
		t.Errorf("Check(lower-case table): %v, want the missing table named", err)
	}

	if _, err := pool.Exec(ctx, `ALTER TABLE "OutboxMessages" ADD COLUMN "Note" varchar(20)`); err != nil {
		t.Fatal(err)
	}
	l = tablesource.Article()
	l.CorrelationID, l.ProcessedAt = "Correlation", "Note"
	err := tablesource.Check(ctx, pool, l)
	for _, w := range []string{
		`CorrelationID: column "Correlation" does not exist`,
		`ProcessedAt: column "Note" is character varying(20), want one of timestamp with time zone, timestamp without time zone`,
	} {
		if !errors.Is(err, tablesource.ErrInvalidLayout) || !strings.Contains(err.Error(), w) {
			t.Errorf("Check(wrong columns): %v, want it to say %q", err, w)
		}
	}

	if _, err := pool.Exec(ctx, `ALTER TABLE "OutboxMessages" ALTER COLUMN "OccurredAt" DROP NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if err := tablesource.Check(ctx, pool, tablesource.Article()); err == nil || !strings.Contains(err.Error(), "allows NULL") {
		t.Errorf("Check(nullable OccurredAt): %v, want it refused", err)
	}
}

func TestPendingKeyOrder(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := articleDB(t)
	ctx := context.Background()
	base := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	id := func(n byte) uuid.UUID { return uuid.UUID{15: n} }

	// Inserted out of order: the read order is OccurredAt, then Id.
	insert(t, pool,
		msg{id: id(5), corr: ptr("order-1"), at: base.Add(2 * time.Second)},
		msg{id: id(4), corr: ptr("order-1"), at: base.Add(time.Second)},
		msg{id: id(3), corr: ptr("order-1"), at: base.Add(time.Second)}, // tie with 4: Id breaks it
		msg{id: id(9), corr: ptr("order-2"), at: base},
		msg{id: id(7), at: base.Add(3 * time.Second)},                   // no correlation id: its own key
		msg{id: id(1), corr: ptr("order-1"), at: base, processed: true}, // already sent
	)
	const partitions = 16
	r, err := tablesource.NewReader(tablesource.Article(), partitions)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := r.Pending(ctx, pool, nil, 100)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	wantIDs := []uuid.UUID{id(9), id(3), id(4), id(5), id(7)}
	if len(rows) != len(wantIDs) {
		t.Fatalf("Pending returned %d rows, want %d: %+v", len(rows), len(wantIDs), rows)
	}
	for i, row := range rows {
		if row.ID != wantIDs[i] {
			t.Errorf("row %d is %s, want %s", i, row.ID, wantIDs[i])
		}
		if row.Problem != nil {
			t.Errorf("row %s: unexpected problem %v", row.ID, row.Problem)
		}
		if want := partition.Of(row.Key, partitions); row.Partition != want {
			t.Errorf("row %s: partition %d, want partition.Of(%q) = %d", row.ID, row.Partition, row.Key, want)
		}
		if row.Type != "OrderPlaced" || row.RoutingKey != "order.placed" || string(row.Payload) != `{"orderId": 1}` {
			t.Errorf("row %s: type %q, routing key %q, payload %s", row.ID, row.Type, row.RoutingKey, row.Payload)
		}
	}
	own := rows[4]
	if own.HasCorrelationID || own.CorrelationID != "" || own.Key != id(7).String() {
		t.Errorf("row without correlation id: key %q (has %v, %q), want its id %s", own.Key, own.HasCorrelationID, own.CorrelationID, id(7))
	}
	if rows[1].Key != "order-1" || !rows[1].HasCorrelationID || rows[1].CorrelationID != "order-1" {
		t.Errorf("row %s: key %q, correlation id %q", rows[1].ID, rows[1].Key, rows[1].CorrelationID)
	}
	if !rows[0].OccurredAt.Equal(base) {
		t.Errorf("row %s: occurred at %v, want %v", rows[0].ID, rows[0].OccurredAt, base)
	}

	// Paging after a position continues the same order.
	var paged []uuid.UUID
	var after *tablesource.Position
	for {
		page, err := r.Pending(ctx, pool, after, 2)
		if err != nil {
			t.Fatalf("Pending after %v: %v", after, err)
		}
		if len(page) == 0 {
			break
		}
		for _, row := range page {
			paged = append(paged, row.ID)
		}
		p := page[len(page)-1].Position()
		after = &p
	}
	if fmt.Sprint(paged) != fmt.Sprint(wantIDs) {
		t.Errorf("paged read = %v, want %v", paged, wantIDs)
	}
	if _, err := r.Pending(ctx, pool, nil, 0); err == nil {
		t.Error("Pending(limit 0): nil error")
	}
}

func TestPendingBadRows(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := articleDB(t)
	ctx := context.Background()
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	long := strings.Repeat("k", 256)
	cases := []struct {
		m    msg
		want string // "" means no problem
	}{
		{msg{id: uuid.UUID{15: 1}, corr: ptr("a"), payload: `[1, 2]`}, `"Payload" is not a JSON object`},
		{msg{id: uuid.UUID{15: 2}, corr: ptr("a"), payload: `"text"`}, `"Payload" is not a JSON object`},
		{msg{id: uuid.UUID{15: 3}, corr: ptr(long)}, `"CorrelationId" is 256 bytes, longer than AMQP's 255-byte short string`},
		{msg{id: uuid.UUID{15: 4}, corr: ptr("")}, `"CorrelationId" is empty`},
		{msg{id: uuid.UUID{15: 5}, corr: ptr(strings.Repeat("k", 255)), payload: ` {"ok": true}`}, ""},
	}
	for i := range cases {
		cases[i].m.at = at.Add(time.Duration(i) * time.Millisecond)
		insert(t, pool, cases[i].m)
	}
	r, err := tablesource.NewReader(tablesource.Article(), partition.DefaultCount)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := r.Pending(ctx, pool, nil, 100)
	if err != nil {
		t.Fatalf("Pending: %v (a bad row must not fail the read)", err)
	}
	if len(rows) != len(cases) {
		t.Fatalf("Pending returned %d rows, want all %d", len(rows), len(cases))
	}
	for i, c := range cases {
		row := rows[i]
		if c.want == "" {
			if row.Problem != nil {
				t.Errorf("row %s: problem %v, want none", row.ID, row.Problem)
			}
			continue
		}
		if !errors.Is(row.Problem, tablesource.ErrBadRow) || !strings.Contains(row.Problem.Error(), c.want) {
			t.Errorf("row %s: problem %v, want ErrBadRow saying %q", row.ID, row.Problem, c.want)
		}
	}
}

// TestPendingPlanWithoutStatistics: on a backlog of 20,000 pending rows
// written since the last ANALYZE (PostgreSQL then guesses that few rows
// are pending), both reads walk the partial index in order and stop after
// the page: they do not scan every pending row and sort. The idle
// intake's probe reads one entry from the index's end.
func TestPendingPlanWithoutStatistics(t *testing.T) {
	testkit.RequirePostgres(t)
	pool := articleDB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER TABLE "OutboxMessages" SET (autovacuum_enabled = off)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO "OutboxMessages"
		SELECT gen_random_uuid(), 'OrderPlaced', 'order.placed', '{"n": 1}', 'order-' || (i % 1000),
		       now() + i * interval '1 ms', NULL
		FROM generate_series(1, 20000) AS i`); err != nil {
		t.Fatalf("write the backlog: %v", err)
	}
	r, err := tablesource.NewReader(tablesource.Article(), 16)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 100
	scanned := regexp.MustCompile(`Index Scan using "IX_OutboxMessages_OccurredAt" on "OutboxMessages" m \(actual rows=(\d+) `)
	for _, c := range []struct {
		name  string
		after *tablesource.Position
	}{
		{"first", nil},
		{"after", &tablesource.Position{OccurredAt: time.Now().Add(5 * time.Second)}},
	} {
		plan, err := r.ExplainPending(ctx, pool, c.after, limit)
		if err != nil {
			t.Fatalf("explain %s: %v", c.name, err)
		}
		m := scanned.FindStringSubmatch(plan)
		if m == nil {
			t.Errorf("read %s without statistics does not walk the partial index in order:\n%s", c.name, plan)
			continue
		}
		if !strings.Contains(plan, "Sort Key: \"OccurredAt\", \"Id\"\n") {
			t.Errorf("read %s does not order by the uuid:\n%s", c.name, plan)
		}
		if n, _ := strconv.Atoi(m[1]); n > 2*limit {
			t.Errorf("read %s of %d rows walked %d index entries:\n%s", c.name, limit, n, plan)
		}
	}
	// The idle intake's probe for a newer row: the newest entry of the
	// partial index, read from its end, whatever the statistics.
	in := tablesource.NewIntake(pool, "n1", r, nil)
	probe := regexp.MustCompile(`Index (Only )?Scan Backward using "IX_OutboxMessages_OccurredAt" on "OutboxMessages" m \(actual rows=(\d+) `)
	plan, err := in.ExplainNewest(ctx, time.Time{})
	if err != nil {
		t.Fatalf("explain the probe: %v", err)
	}
	if m := probe.FindStringSubmatch(plan); m == nil || m[2] != "1" {
		t.Errorf("the idle probe without statistics does not read one entry from the partial index's end:\n%s", plan)
	}
	// Every row but the first 1,000 marked processed, not vacuumed: their
	// entries stay at the index's end, below the last row read. The probe
	// after that row walks none of them, generic plan or custom.
	var last time.Time
	if err := pool.QueryRow(ctx, `WITH marked AS (
		UPDATE "OutboxMessages" SET "ProcessedAt" = now()
		WHERE "Id" IN (SELECT "Id" FROM "OutboxMessages" ORDER BY "OccurredAt" OFFSET 1000)
		RETURNING "OccurredAt") SELECT max("OccurredAt") FROM marked`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	plan, err = in.ExplainNewest(ctx, last)
	if err != nil {
		t.Fatalf("explain the probe: %v", err)
	}
	if m := probe.FindStringSubmatch(plan); m == nil || m[2] != "0" || topBuffers(plan) > 10 {
		t.Errorf("the idle probe after the last row read walks the marked rows' entries:\n%s", plan)
	}
	plan, buffers := explainGeneric(t, pool, in.NewestSQL(), "'"+last.Format(time.RFC3339Nano)+"'::timestamptz")
	if !probe.MatchString(plan) || buffers > 10 {
		t.Errorf("the idle probe's generic plan does not read the partial index's end (%d buffers):\n%s", buffers, plan)
	}
}
