package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// TestAdoptedTableRelayed: a node with -table-layout article relays the
// article's table, written by four producers at once and by one producer
// whose transaction commits late, across a restart of the node under
// another name: every row arrives once, each key in the order its rows
// were written, with gap-free x-ordo-key-seq and prev, the row committed
// late after its key's rows, and every row's "ProcessedAt" is set.
func TestAdoptedTableRelayed(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 4
	dbURL, pool := testkit.NewDatabasePool(t, 8)
	ctx := testkit.Context(t, 2*time.Minute)
	if _, err := pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
		t.Fatal(err)
	}
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	cfgFor := func(name string) node.Config {
		cfg := node.DefaultConfig()
		cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), name
		cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", partitions, 4
		cfg.Relay.PollInterval = 50 * time.Millisecond
		cfg.TableLayout, cfg.TableExchange = "article", ex
		return cfg
	}
	opts := node.Options{Logger: testkit.Logger(t, slog.LevelWarn)}
	_, stop1 := runNode(t, cfgFor("adopt-1"), opts)

	// The late row: its producer's transaction takes its "OccurredAt"
	// first and commits after the key's later rows were relayed.
	lateTx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lateTx.Rollback(context.Background()) //nolint:errcheck // committed below
	lateID := uuid.Must(uuid.NewV7())
	if _, err := lateTx.Exec(ctx, `INSERT INTO "OutboxMessages" ("Id", "Type", "RoutingKey", "Payload", "CorrelationId", "OccurredAt")
		VALUES ($1, 'OrderPlaced', 'order.placed', '{"late": true}', 'key-0', clock_timestamp())`, lateID); err != nil {
		t.Fatal(err)
	}

	const producers, perProducer, keysPerProducer = 4, 150, 5
	var mu sync.Mutex
	written := map[string][]string{} // key -> ids in the order written
	produce := func(from, to int) {
		var wg sync.WaitGroup
		for p := range producers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from; i < to; i++ {
					key := fmt.Sprintf("key-%d", p*keysPerProducer+i%keysPerProducer)
					id := uuid.Must(uuid.NewV7())
					if err := testkit.InsertArticleRow(ctx, pool, id, key, time.Now()); err != nil {
						t.Errorf("producer %d: %v", p, err)
						return
					}
					mu.Lock()
					written[key] = append(written[key], id.String())
					mu.Unlock()
					checker.Expect(id.String())
				}
			}()
		}
		wg.Wait()
	}
	produce(0, perProducer/2)
	checker.WaitDistinct(t, producers*perProducer/4, time.Minute)
	stop1() // a restart under another name: the leases move
	_, _ = runNode(t, cfgFor("adopt-2"), opts)
	produce(perProducer/2, perProducer)
	checker.WaitDistinct(t, producers*perProducer, time.Minute)
	if err := lateTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	checker.Expect(lateID.String())
	rep := checker.WaitDistinct(t, producers*perProducer+1, time.Minute)
	if !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("deliveries: %s", rep.Detail())
	}

	got := map[string][]string{}
	var lateSeq, key0Top int64
	for _, d := range checker.Deliveries() {
		if d.Type != "OrderPlaced" || d.RoutingKey != "order.placed" {
			t.Fatalf("delivery %s: type %q routing key %q", d.MessageID, d.Type, d.RoutingKey)
		}
		if d.MessageID == lateID.String() {
			lateSeq = d.KeySeq
			continue
		}
		got[d.CorrelationID] = append(got[d.CorrelationID], d.MessageID)
		if d.CorrelationID == "key-0" {
			key0Top = max(key0Top, d.KeySeq)
		}
	}
	for key, ids := range written {
		if fmt.Sprint(got[key]) != fmt.Sprint(ids) {
			t.Fatalf("key %s delivered in the order %v, written %v", key, got[key], ids)
		}
	}
	if lateSeq != key0Top+1 {
		t.Fatalf("the late row has key_seq %d, want %d (after its key's rows)", lateSeq, key0Top+1)
	}
	testkit.WaitFor(t, 30*time.Second, `every row's "ProcessedAt" set`, func() bool {
		var pending int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM "OutboxMessages" WHERE "ProcessedAt" IS NULL`).Scan(&pending)
		return err == nil && pending == 0
	})
}

// TestTableLayoutValidated: an unknown layout, a layout with -source,
// and an empty or over-long exchange are refused, each at its field.
func TestTableLayoutValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		edit  func(*node.Config)
		field string
	}{
		{"unknown layout", func(c *node.Config) { c.TableLayout = "rebus" }, "TableLayout"},
		{"unknown column key", func(c *node.Config) { c.TableLayout = "article;colour=red" }, "TableLayout"},
		{"column missing", func(c *node.Config) { c.TableLayout = "table=outbox;id=id" }, "TableLayout"},
		{"source layout column missing", func(c *node.Config) {
			c.Sources = []node.Source{{Name: "orders", PostgresURL: c.PostgresURL, Layout: "article;table="}}
		}, "Sources"},
		{"with sources", func(c *node.Config) {
			c.TableLayout = "article"
			c.Sources = []node.Source{{Name: "orders", PostgresURL: c.PostgresURL}}
		}, "TableLayout"},
		{"empty exchange", func(c *node.Config) { c.TableLayout, c.TableExchange = "article", "" }, "TableExchange"},
		{"long exchange", func(c *node.Config) { c.TableLayout, c.TableExchange = "article", strings.Repeat("x", 256) }, "TableExchange"},
		{"zero poll min", func(c *node.Config) { c.TableLayout, c.TablePollMin = "article", 0 }, "TablePollMin"},
		{"poll max below min", func(c *node.Config) {
			c.TableLayout, c.TablePollMin, c.TablePollMax = "article", 50*time.Millisecond, 20*time.Millisecond
		}, "TablePollMax"},
		{"negative probe interval", func(c *node.Config) { c.TableLayout, c.TableProbeInterval = "article", -time.Millisecond }, "TableProbeInterval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			tc.edit(&cfg)
			err := cfg.Validate()
			if !slices.Contains(confcheck.Fields(err), tc.field) {
				t.Fatalf("Validate: %v, want a problem at %s", err, tc.field)
			}
		})
	}
	cfg := node.DefaultConfig()
	cfg.TableLayout = "article"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the article's layout with the default exchange: %v", err)
	}
}

// TestRenamedTableRelayed: a table whose table and column names are not
// the article's, mapped with a layout spec, is relayed like the
// article's: every row once, each key in the order written, each row's
// processed-at column set.
func TestRenamedTableRelayed(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	// public.outbox: the name of Ordo's own table, which a node relaying
	// an adopted table does not create.
	for _, table := range []string{"app.outbox_messages", "public.outbox"} {
		t.Run(table, func(t *testing.T) {
			t.Parallel()
			relayRenamed(t, table)
		})
	}
}

// relayRenamed relays table (schema.name), in snake case, end to end.
func relayRenamed(t *testing.T, table string) {
	schema, name, _ := strings.Cut(table, ".")
	dbURL, pool := testkit.NewDatabasePool(t, 8)
	ctx := testkit.Context(t, 2*time.Minute)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema+`;
		CREATE TABLE `+table+` (
		    message_id uuid PRIMARY KEY, kind text NOT NULL, topic text NOT NULL, body jsonb NOT NULL,
		    "AggregateId" text, created_at timestamptz NOT NULL, sent_at timestamptz);
		CREATE INDEX ON `+table+` (created_at) WHERE sent_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	cfg := node.DefaultConfig()
	cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "renamed"
	cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", 4, 4
	cfg.Relay.PollInterval = 50 * time.Millisecond
	cfg.TableLayout = "table=" + name + ";schema=" + schema + ";id=message_id;type=kind;routing_key=topic;payload=body;" +
		"correlation_id=AggregateId;occurred_at=created_at;processed_at=sent_at"
	cfg.TableExchange = ex
	_, stop := runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn)})
	defer stop()
	written := map[string][]string{}
	for i := range 60 {
		key := fmt.Sprintf("agg-%d", i%6)
		id := uuid.Must(uuid.NewV7())
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (message_id, kind, topic, body, "AggregateId", created_at)
			VALUES ($1, 'OrderPlaced', 'order.placed', '{"n": 1}', $2, clock_timestamp())`, id, key); err != nil {
			t.Fatal(err)
		}
		written[key] = append(written[key], id.String())
		checker.Expect(id.String())
	}
	rep := checker.WaitFor(t, time.Minute, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	got := map[string][]string{}
	for _, d := range checker.Deliveries() {
		if ids := got[d.CorrelationID]; !slices.Contains(ids, d.MessageID) {
			got[d.CorrelationID] = append(ids, d.MessageID)
		}
	}
	for key, ids := range written {
		if !slices.Equal(got[key], ids) {
			t.Fatalf("key %s delivered %v, written %v", key, got[key], ids)
		}
	}
	testkit.WaitFor(t, 30*time.Second, "every row's sent_at set", func() bool {
		var pending int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE sent_at IS NULL`).Scan(&pending)
		return err == nil && pending == 0
	})
}

// TestAdoptedTableBesideAnOutbox: a node relays two sources at once, the
// article's table in one database (-source-layout shop=article) and
// Ordo's own outbox in another: both arrive, each key in order.
func TestAdoptedTableBesideAnOutbox(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 4
	ob := testkit.NewOutbox(t, partitions, 4)
	shopURL, shop := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, 2*time.Minute)
	if _, err := shop.Exec(ctx, tablesource.ArticleDDL); err != nil {
		t.Fatal(err)
	}
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	startNode(t, ob.URL, partitions, func(c *node.Config) {
		c.Sources = []node.Source{{Name: "default", PostgresURL: ob.URL}, {Name: "shop", PostgresURL: shopURL, Layout: "article"}}
		c.TableExchange = ex
	})
	for i := range 40 {
		id := uuid.Must(uuid.NewV7())
		if err := testkit.InsertArticleRow(ctx, shop, id, fmt.Sprintf("shop-%d", i%4), time.Now()); err != nil {
			t.Fatal(err)
		}
		checker.Expect(id.String())
		ob.Enqueue(t, checker, outbox.Message{CorrelationID: fmt.Sprintf("outbox-%d", i%4), Exchange: ex, RoutingKey: "r", Type: "t", Payload: []byte(`{}`)})
	}
	if rep := checker.WaitDistinct(t, 80, time.Minute); !rep.OK() || rep.Duplicates != 0 || rep.Keys != 8 {
		t.Fatalf("deliveries: %s", rep.Detail())
	}
}

// TestAdoptedTableCreatedLater: a node started before the article's
// table exists waits, retrying its source's migration (which checks the
// table), and relays the table once it is created.
func TestAdoptedTableCreatedLater(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 4
	dbURL, pool := testkit.NewDatabasePool(t, 4)
	ctx := testkit.Context(t, time.Minute)
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	created := make(chan error, 1)
	go func() {
		// The table comes once the node's migration has created Ordo's
		// own tables, so after the migration's first check of it.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'ordo_table_rows'`).Scan(&n); err == nil && n == 1 {
				_, err := pool.Exec(ctx, tablesource.ArticleDDL)
				created <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		created <- fmt.Errorf("the node never migrated Ordo's own tables")
	}()
	startNode(t, dbURL, partitions, func(c *node.Config) { c.TableLayout, c.TableExchange = "article", ex })
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	if err := testkit.InsertArticleRow(ctx, pool, id, "order-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	checker.Expect(id.String())
	if rep := checker.WaitDistinct(t, 1, 30*time.Second); !rep.OK() {
		t.Fatalf("deliveries: %s", rep.Detail())
	}
}

// TestAdoptedTableBacklogInStatus: /status counts an adopted table's
// rows, not Ordo's own outbox: rows its exchange cannot route are parked
// (one attempt each here) and counted as pending and parked in their
// partitions.
func TestAdoptedTableBacklogInStatus(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions, rows = 4, 6
	dbURL, pool := testkit.NewDatabasePool(t, 8)
	ctx := testkit.Context(t, 2*time.Minute)
	if _, err := pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
		t.Fatal(err)
	}
	cfg := node.DefaultConfig()
	cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "adopt-status"
	cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", partitions, 4
	cfg.Relay.PollInterval, cfg.Relay.MaxAttempts = 50*time.Millisecond, 1
	cfg.BacklogInterval = 100 * time.Millisecond
	cfg.TableLayout, cfg.TableExchange = "article", testkit.NewExchange(t) // nothing bound: every publish returns
	addr, _ := runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelError)})
	for i := range rows {
		if err := testkit.InsertArticleRow(ctx, pool, uuid.Must(uuid.NewV7()), fmt.Sprintf("key-%d", i), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, time.Minute, "every row parked and counted in /status", func() bool {
		var pending, parked int64
		for _, p := range nodeStatus(t, addr).Leases {
			pending += p.Pending
			parked += p.Parked
		}
		return pending == rows && parked == rows
	})
}

// TestAdminOnAnAdoptedTable: /admin serves a node's adopted table as it
// serves the outbox, over the rows taken in. Rows its exchange returns
// are parked, and listed with what they carry and what waits behind them;
// once the exchange routes, a retry publishes the parked row and its key's
// held row in order; a skip publishes nothing, sets the user's
// "ProcessedAt" and lets nothing of its key be taken in again; both are
// audited; purge answers 501.
func TestAdminOnAnAdoptedTable(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	dbURL, pool := testkit.NewDatabasePool(t, 8)
	ctx := testkit.Context(t, 2*time.Minute)
	if _, err := pool.Exec(ctx, tablesource.ArticleDDL); err != nil {
		t.Fatal(err)
	}
	exchange := testkit.NewExchange(t) // nothing bound yet: every publish returns
	cfg := node.DefaultConfig()
	cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "adopt-admin"
	cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", 4, 4
	cfg.Relay.PollInterval, cfg.Relay.MaxAttempts = 50*time.Millisecond, 1
	cfg.TableLayout, cfg.TableExchange, cfg.AdminToken = "article", exchange, adminToken
	addr, _ := runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelError)})

	t0 := time.Now().Add(-time.Minute)
	a1, a2, b1 := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, r := range []struct {
		id  uuid.UUID
		key string
		at  time.Time
	}{{a1, "a", t0}, {a2, "a", t0.Add(time.Second)}, {b1, "b", t0}} {
		if err := testkit.InsertArticleRow(ctx, pool, r.id, r.key, r.at); err != nil {
			t.Fatal(err)
		}
	}
	var parked []admin.Parked
	testkit.WaitFor(t, time.Minute, "a1 and b1 parked, a2 held behind a1", func() bool {
		parked = nil
		adminCall(t, addr, http.MethodGet, "/admin/parked", http.StatusOK, &parked)
		return len(parked) == 2 && slices.ContainsFunc(parked, func(p admin.Parked) bool { return p.ID == a1 && p.Waiting == 1 })
	})
	for _, p := range parked {
		if p.Exchange != exchange || p.Type != "OrderPlaced" || p.RoutingKey != "order.placed" || p.KeySeq != 1 || p.LastError == "" {
			t.Errorf("parked %+v: want exchange %s, type OrderPlaced, routing key order.placed, key_seq 1 and its error", p, exchange)
		}
	}

	checker := testkit.NewChecker(t, testkit.AMQPURL(), exchange, "#")
	adminCall(t, addr, http.MethodPost, "/admin/messages/"+a1.String()+"/retry", http.StatusOK, nil)
	adminCall(t, addr, http.MethodPost, "/admin/messages/"+b1.String()+"/skip", http.StatusOK, nil)
	checker.WaitDistinct(t, 2, time.Minute)
	processed := func(id uuid.UUID) bool {
		var at *time.Time
		if err := pool.QueryRow(ctx, `SELECT "ProcessedAt" FROM "OutboxMessages" WHERE "Id" = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at != nil
	}
	testkit.WaitFor(t, time.Minute, "every row's ProcessedAt set", func() bool {
		return processed(a1) && processed(a2) && processed(b1)
	})
	var got []string
	for _, d := range checker.Deliveries() {
		got = append(got, d.MessageID)
	}
	if want := []string{a1.String(), a2.String()}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want a1 then a2 %v and nothing of the skipped b1 (%s)", got, want, b1)
	}
	var dead bool
	if err := pool.QueryRow(ctx, `SELECT dead_at IS NOT NULL FROM ordo_table_rows WHERE id = $1`, b1).Scan(&dead); err != nil || !dead {
		t.Errorf("the skipped row in ordo_table_rows: dead %v (%v)", dead, err)
	}
	var audits string
	if err := pool.QueryRow(ctx, `SELECT string_agg(action || ' ' || result, ', ' ORDER BY id) FROM ordo_operator_audit`).Scan(&audits); err != nil {
		t.Fatal(err)
	}
	if audits != "retry retried, skip skipped" {
		t.Errorf("audit: %q, want the retry and the skip", audits)
	}
	adminCall(t, addr, http.MethodPost, "/admin/purge", http.StatusNotImplemented, nil)
	adminCall(t, addr, http.MethodPost, "/admin/messages/"+b1.String()+"/retry", http.StatusConflict, nil)
}

// adminCall sends method path to the node's /admin with the admin token,
// fails t unless the answer's status is code, and decodes its JSON into
// out unless out is nil.
func adminCall(t *testing.T, httpAddr, method, path string, code int, out any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+httpAddr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != code {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, strings.TrimSpace(string(body)), code)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, body)
		}
	}
}
