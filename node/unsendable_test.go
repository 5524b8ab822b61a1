package node_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/nodetest"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
)

// startNode runs one node without gossip on dbURL until the test ends and
// returns its HTTP address.
func startNode(t *testing.T, dbURL string, partitions int, edit func(*node.Config)) string {
	t.Helper()
	return startNodeWith(t, dbURL, partitions, edit, nodehook.Hooks{})
}

// startNodeWith is startNode with options (its Logger and Ready are
// replaced).
func startNodeWith(t *testing.T, dbURL string, partitions int, edit func(*node.Config), hooks nodehook.Hooks) string {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.PostgresURL, cfg.AMQP.URL, cfg.NodeName = dbURL, testkit.AMQPURL(), "solo"
	cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns = "127.0.0.1:0", partitions, 3
	cfg.Relay.PollInterval = 200 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	addr, stop := nodetest.Run(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn)}, hooks)
	t.Cleanup(stop)
	return addr
}

// runNode runs a node with cfg and opts until the test ends
// (internal/nodetest), and returns its HTTP address once it serves, and a
// stop that ends it and waits for it (idempotent).
func runNode(t *testing.T, cfg node.Config, opts node.Options) (httpAddr string, stop func()) {
	t.Helper()
	return nodetest.Run(t, cfg, opts, nodehook.Hooks{})
}

// nodeStatus fetches a node's /status.
func nodeStatus(t *testing.T, addr string) node.Status {
	t.Helper()
	var st node.Status
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestUnsendableRowsParked: rows written by a plain SQL INSERT that AMQP
// cannot carry (three header values of 60 KB, together over frame_max; a
// header value that is a JSON object; a 20 MiB payload) are parked, and
// every other key flows, on one connection: no row makes the broker close
// it (it once did, about 7 times a second, and nothing else went out).
// The 20 MiB row, on a loaded machine, takes longer to read than the read
// timeout (1 s): it is read alone and charged an attempt per timeout
// (docs/design.md, "A slow row is read alone"), and the good keys of its
// partition wait until it parks, 5 timeouts and more later: hence the
// minute the good messages are given.
func TestUnsendableRowsParked(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 4
	ob := testkit.NewOutbox(t, partitions, 3)
	dbURL, pool := ob.URL, ob.Pool
	ctx := testkit.Context(t, 2*time.Minute)
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex)
	addr := startNode(t, dbURL, partitions, func(c *node.Config) { c.Relay.RetryMin, c.Relay.RetryMax = 50*time.Millisecond, 200*time.Millisecond })

	bad := map[string]string{ // key -> the row's headers and payload, as SQL
		"three-60k-headers": `jsonb_build_object('a', repeat('x', 61440), 'b', repeat('y', 61440), 'c', repeat('z', 61440)), '{}'::jsonb`,
		"object-header":     `'{"trace": {"id": 1}}'::jsonb, '{}'::jsonb`,
		"20mib-payload":     `'{}'::jsonb, jsonb_build_object('blob', repeat('x', 20 << 20))`,
	}
	badIDs := map[string]uuid.UUID{}
	for key, values := range bad {
		id := uuid.Must(uuid.NewV7())
		badIDs[key] = id
		if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, headers, payload)
			VALUES ($1, $2, $3, $4, 'bad', 't', %s)`, values), id, partition.Of(key, partitions), key, ex); err != nil {
			t.Fatalf("insert %s: %v", key, err)
		}
	}
	prod, _ := outbox.NewProducer(partitions)
	const good = 400
	msgs := make([]outbox.Message, good)
	for i := range msgs {
		msgs[i] = outbox.Message{CorrelationID: fmt.Sprintf("good-%d", i%40), Exchange: ex, RoutingKey: "good", Type: "t", Payload: json.RawMessage(`{}`)}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := prod.Enqueue(ctx, tx, msgs...)
		for _, id := range ids {
			checker.Expect(id.String())
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep := checker.WaitDistinct(t, good, time.Minute)
	t.Logf("%d good messages delivered in %v: %s", good, time.Since(start).Round(time.Millisecond), rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	for key, id := range badIDs {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var parked bool
			var lastErr *string
			if err := pool.QueryRow(ctx, `SELECT parked_at IS NOT NULL, last_error FROM outbox WHERE id = $1`, id).Scan(&parked, &lastErr); err != nil {
				t.Fatal(err)
			}
			if parked {
				t.Logf("%s parked: %s", key, *lastErr)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not parked after 30s (last error %v)", key, lastErr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if st := nodeStatus(t, addr); st.BrokerState.ChannelsOpened != 1 {
		t.Fatalf("%d channels opened: a row made the broker close the connection or channel", st.BrokerState.ChannelsOpened)
	}
}
