package relay_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/nodetest"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	ordonode "github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

const testPartitions = 8

// harness is one test's database, exchange and checker.
type harness struct {
	t        *testing.T
	dbURL    string
	pool     *pgxpool.Pool
	prod     *outbox.Producer
	exchange string
	checker  *testkit.Checker
}

// newHarness makes a database with the outbox installed, an exchange, and a
// checker bound to "order.*" (so "unroutable.*" routing keys are returned).
func newHarness(t *testing.T) *harness {
	t.Helper()
	testkit.RequireRabbitMQ(t)
	dbURL, pool := testkit.NewDatabasePool(t, 6)
	ctx := testkit.Context(t, 30*time.Second)
	if err := outbox.Migrate(ctx, pool, testPartitions); err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(ctx, pool, testPartitions); err != nil {
		t.Fatal(err)
	}
	prod, err := outbox.NewProducer(testPartitions)
	if err != nil {
		t.Fatal(err)
	}
	ex := testkit.NewExchange(t)
	return &harness{t: t, dbURL: dbURL, pool: pool, prod: prod, exchange: ex,
		checker: testkit.NewChecker(t, testkit.AMQPURL(), ex, "order.*")}
}

func (h *harness) msg(key, routingKey, typ string) outbox.Message {
	return outbox.Message{
		CorrelationID: key, Exchange: h.exchange, RoutingKey: routingKey, Type: typ,
		Payload: json.RawMessage(fmt.Sprintf(`{"key":%q,"at":%d}`, key, time.Now().UnixNano())),
	}
}

// enqueue writes msgs in one transaction and tells the checker to expect
// the routable ones.
func (h *harness) enqueue(msgs ...outbox.Message) []uuid.UUID {
	h.t.Helper()
	ctx := testkit.Context(h.t, 30*time.Second)
	var ids []uuid.UUID
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = h.prod.Enqueue(ctx, tx, msgs...)
		return err
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return ids
}

func (h *harness) expect(ids []uuid.UUID) {
	for _, id := range ids {
		h.checker.Expect(id.String())
	}
}

// placeAndCancel enqueues OrderPlaced and then OrderCancelled for n new
// orders, each in its own transaction, and expects them all.
func (h *harness) placeAndCancel(n int) {
	h.t.Helper()
	for range n {
		key := uuid.Must(uuid.NewV7()).String()
		h.expect(h.enqueue(h.msg(key, "order.placed", "bookstore.order-placed.v1")))
		h.expect(h.enqueue(h.msg(key, "order.cancelled", "bookstore.order-cancelled.v1")))
	}
}

func (h *harness) count(where string, args ...any) int {
	h.t.Helper()
	var n int
	ctx := testkit.Context(h.t, 10*time.Second)
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE `+where, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// waitRows waits until the count of rows matching where satisfies ok.
func (h *harness) waitRows(timeout time.Duration, what string, ok func(int) bool, where string, args ...any) int {
	h.t.Helper()
	start := time.Now()
	for {
		n := h.count(where, args...)
		if ok(n) {
			h.t.Logf("%s after %v (%d rows)", what, time.Since(start).Round(time.Millisecond), n)
			return n
		}
		if time.Since(start) > timeout {
			h.t.Fatalf("%s: not within %v (%d rows)", what, timeout, n)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// nodeOpts configures an in-process node.
type nodeOpts struct {
	name      string
	amqpURL   string // default testkit.AMQPURL()
	dbURL     string // default the harness database
	perKey    int    // the per-key limit, when above 1 (internal/relayhook)
	window    int
	wrapPub   func(relay.Publisher) relay.Publisher
	wrapStore func(relay.Store) relay.Store
	// wrapOwn wraps the leaser as the relay sees it (a view that does not
	// notice a lost lease, say).
	wrapOwn func(relay.Ownership) relay.Ownership
	// leaseDBURL is the leaser's own database URL (default: the node's),
	// so a test can cut the leaser's link alone.
	leaseDBURL string
	logger     *slog.Logger
	// retention enables retention with this age, run every 100 ms.
	retention      time.Duration
	retentionChunk int
	confirmTimeout time.Duration
	// callTimeout and heartbeat replace the publisher's defaults (5 s each).
	callTimeout, heartbeat time.Duration
	// pollInterval and retryMin/retryMax replace the harness's short
	// defaults (200 ms; 20-200 ms).
	pollInterval       time.Duration
	retryMin, retryMax time.Duration
	// tracer, if set, is the relay's TracerProvider.
	tracer trace.TracerProvider
	// editConfig, if set, edits the node's configuration last.
	editConfig func(*ordonode.Config)
}

// node is a relay, its leaser and its publisher, built and run in-process
// by node.Run: node's own build (docs/design.md), with the test hooks of
// internal/nodehook, not a copy of it.
type node struct {
	stop   func() // ends the node and waits for it (idempotent; also at the test's end)
	relay  *relay.Relay
	pub    relay.Publisher
	leaser *lease.Leaser
}

// brokerState is the node's RabbitMQ publisher's state (the node's broker
// embeds *rabbitmq.Publisher).
func (n *node) brokerState(t testing.TB) rabbitmq.State {
	t.Helper()
	p, ok := n.pub.(interface{ Status() rabbitmq.State })
	if !ok {
		t.Fatalf("the node's publisher %T is not RabbitMQ's", n.pub)
	}
	return p.Status()
}

// config returns the node's Config: one source (the harness database, or
// o.dbURL), no gossip, testPartitions partitions, and the harness's short
// poll interval, backoff, reconnect and retention interval.
func (h *harness) config(o nodeOpts) ordonode.Config {
	cfg := ordonode.DefaultConfig()
	cfg.NodeName, cfg.PostgresURL, cfg.AMQP.URL = o.name, cmp.Or(o.dbURL, h.dbURL), cmp.Or(o.amqpURL, testkit.AMQPURL())
	cfg.HTTPAddr, cfg.Partitions, cfg.DBMaxConns, cfg.LeaseTTL = "127.0.0.1:0", testPartitions, 4, 2*time.Second
	r := &cfg.Relay
	r.Window = cmp.Or(o.window, r.Window)
	r.RetryMin, r.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	if o.retryMin > 0 {
		r.RetryMin, r.RetryMax = o.retryMin, max(o.retryMax, o.retryMin)
	}
	r.PollInterval = cmp.Or(o.pollInterval, 200*time.Millisecond)
	r.RetentionAge, r.RetentionInterval = o.retention, 100*time.Millisecond
	r.RetentionChunk = cmp.Or(o.retentionChunk, r.RetentionChunk)
	a := &cfg.AMQP
	a.ReconnectMax = 500 * time.Millisecond
	a.ConfirmTimeout = cmp.Or(o.confirmTimeout, a.ConfirmTimeout)
	a.CallTimeout, a.Heartbeat = cmp.Or(o.callTimeout, a.CallTimeout), cmp.Or(o.heartbeat, a.Heartbeat)
	if o.editConfig != nil {
		o.editConfig(&cfg)
	}
	return cfg
}

// startNode runs a node with o until the test ends (or stop), and returns
// it once it serves.
func (h *harness) startNode(o nodeOpts) *node {
	h.t.Helper()
	o.name = cmp.Or(o.name, "node-"+uuid.NewString()[:8])
	if o.logger == nil {
		o.logger = testkit.Logger(h.t, slog.LevelWarn).With("node", o.name)
	}
	n := &node{}
	hooks := nodehook.Hooks{WrapPublisher: o.wrapPub, WrapStore: o.wrapStore, WrapOwnership: o.wrapOwn,
		LeaseURL: o.leaseDBURL, PerKeyLimit: o.perKey, Built: func(p nodehook.Parts) {
			n.relay, n.pub, n.leaser = p.Sources[0].Relay, p.Publisher, p.Sources[0].Leaser
		}}
	_, n.stop = nodetest.Run(h.t, h.config(o), ordonode.Options{Logger: o.logger, TracerProvider: o.tracer}, hooks)
	return n
}

// crash stops the node as stop does: the relay settles what it can and the
// leaser releases the leases, so the next owner claims them at once. A
// crash that leaves them to expire is crashNode in crash_test.go.
func (n *node) crash() { n.stop() }

// faultyPublisher makes about rate of first attempts fail: half are not
// sent at all and reported as nacked, half are sent with a routing key
// nothing is bound to, so the broker really returns them.
type faultyPublisher struct {
	inner relay.Publisher
	rate  float64

	mu       sync.Mutex
	seen     map[uuid.UUID]bool
	nacked   int
	returned int
}

func newFaulty(rate float64) func(relay.Publisher) relay.Publisher {
	return func(p relay.Publisher) relay.Publisher {
		return &faultyPublisher{inner: p, rate: rate, seen: map[uuid.UUID]bool{}}
	}
}

func (f *faultyPublisher) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	f.mu.Lock()
	first := !f.seen[m.ID]
	f.seen[m.ID] = true
	fault := first && rand.Float64() < f.rate
	nack := fault && rand.IntN(2) == 0
	if fault && nack {
		f.nacked++
	} else if fault {
		f.returned++
	}
	f.mu.Unlock()
	switch {
	case nack:
		go settle(relay.Result{Outcome: relay.Nacked, Err: fmt.Errorf("injected nack")})
		return nil
	case fault:
		bad := *m
		bad.RoutingKey = "unroutable." + m.RoutingKey
		err := f.inner.Publish(ctx, &bad, settle)
		if err != nil {
			// Not sent, so nothing returned: the next attempt is a first.
			f.mu.Lock()
			f.returned--
			delete(f.seen, m.ID)
			f.mu.Unlock()
		}
		return err
	}
	return f.inner.Publish(ctx, m, settle)
}

func (f *faultyPublisher) Connected() bool { return f.inner.Connected() }

func (f *faultyPublisher) faults() (nacked, returned int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nacked, f.returned
}

type testkitReport = testkit.Report

// countingStore records retention calls.
type countingStore struct {
	relay.Store
	mu      sync.Mutex
	n       int
	biggest int64
}

func (c *countingStore) DeleteProcessed(ctx context.Context, partition int, epoch int64, olderThan time.Duration, limit int) (int64, error) {
	n, err := c.Store.DeleteProcessed(ctx, partition, epoch, olderThan, limit)
	c.mu.Lock()
	c.n++
	c.biggest = max(c.biggest, n)
	c.mu.Unlock()
	return n, err
}

func (c *countingStore) calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *countingStore) maxDeleted() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.biggest
}
