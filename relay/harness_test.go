package relay_test

import (
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
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/internal/relayhook"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
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
	dbURL, pool := testkit.NewTestDB(t, 6)
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
	// editConfig, if set, edits the relay's configuration last.
	editConfig func(*relay.Config)
	// pollInterval and retryMin/retryMax replace the harness's short
	// defaults (200 ms; 20-200 ms).
	pollInterval       time.Duration
	retryMin, retryMax time.Duration
	// tracer, if set, is the relay's TracerProvider.
	tracer trace.TracerProvider
}

// node is a relay, its leaser and its publisher, run in-process.
type node struct {
	t        *testing.T
	cancel   context.CancelFunc
	running  errgroup.Group // the relay
	stopBG   context.CancelFunc
	bg       errgroup.Group // its leaser and publisher
	relay    *relay.Relay
	pub      *rabbitmq.Publisher
	leaser   *lease.Leaser
	stopOnce sync.Once
}

func (h *harness) startNode(o nodeOpts) *node {
	h.t.Helper()
	if o.name == "" {
		o.name = "node-" + uuid.NewString()[:8]
	}
	if o.amqpURL == "" {
		o.amqpURL = testkit.AMQPURL()
	}
	if o.logger == nil {
		o.logger = testkit.Logger(h.t, slog.LevelWarn).With("node", o.name)
	}
	pool := h.pool
	if o.dbURL != "" {
		pool = testkit.NewPool(h.t, o.dbURL, 4)
	}
	all := make([]int, testPartitions)
	for i := range all {
		all[i] = i
	}
	connCfg := pool.Config().ConnConfig
	if o.leaseDBURL != "" {
		cfg, err := pgx.ParseConfig(o.leaseDBURL)
		if err != nil {
			h.t.Fatal(err)
		}
		connCfg = cfg
	}
	lcfg := lease.ConfigWithTTL(2 * time.Second)
	lcfg.Node, lcfg.Want, lcfg.Logger = o.name, func() []int { return all }, o.logger
	lcfg.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return pgx.ConnectConfig(cctx, connCfg.Copy())
	}
	leaser, err := lease.New(lcfg)
	if err != nil {
		h.t.Fatal(err)
	}
	amqpPub, err := rabbitmq.New(rabbitmq.Config{URL: o.amqpURL, Window: max(o.window, 64), Logger: o.logger,
		ReconnectMax: 500 * time.Millisecond, ConfirmTimeout: o.confirmTimeout,
		CallTimeout: o.callTimeout, Heartbeat: o.heartbeat})
	if err != nil {
		h.t.Fatal(err)
	}
	var pub relay.Publisher = amqpPub
	if o.wrapPub != nil {
		pub = o.wrapPub(pub)
	}
	var store relay.Store = pgstore.New(pool, o.name, o.logger)
	if o.wrapStore != nil {
		store = o.wrapStore(store)
	}
	cfg := relay.DefaultConfig()
	cfg.Node = o.name
	if o.window > 0 {
		cfg.Window = o.window
	}
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	if o.retryMin > 0 {
		cfg.RetryMin, cfg.RetryMax = o.retryMin, max(o.retryMax, o.retryMin)
	}
	cfg.PollInterval = 200 * time.Millisecond
	if o.pollInterval > 0 {
		cfg.PollInterval = o.pollInterval
	}
	cfg.Logger = o.logger
	cfg.TracerProvider = o.tracer
	cfg.RetentionAge = o.retention
	cfg.RetentionInterval = 100 * time.Millisecond
	if o.retentionChunk > 0 {
		cfg.RetentionChunk = o.retentionChunk
	}
	if o.editConfig != nil {
		o.editConfig(&cfg)
	}
	var own relay.Ownership = leaser
	if o.wrapOwn != nil {
		own = o.wrapOwn(leaser)
	}
	rl, err := relay.New(cfg, store, pub, own)
	if err != nil {
		h.t.Fatal(err)
	}
	n := &node{t: h.t, relay: rl, pub: amqpPub, leaser: leaser}
	bgCtx, stopBG := context.WithCancel(context.Background())
	n.stopBG = stopBG
	n.bg.Go(func() error { return amqpPub.Run(bgCtx) })
	n.bg.Go(func() error { return leaser.Run(bgCtx) })
	ctx, cancel := context.WithCancel(relayhook.WithPerKeyLimit(context.Background(), o.perKey))
	n.cancel = cancel
	n.running.Go(func() error { return rl.Run(ctx) })
	h.t.Cleanup(n.stop)
	return n
}

// stop shuts the node down in order: relay, then leases and broker.
func (n *node) stop() {
	n.stopOnce.Do(func() {
		n.cancel()
		if err := n.running.Wait(); err != nil {
			n.t.Errorf("relay: %v", err)
		}
		n.stopBG()
		if err := n.bg.Wait(); err != nil {
			n.t.Errorf("leaser or publisher: %v", err)
		}
	})
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
