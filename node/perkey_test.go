package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
)

// headFails fails the first attempt of every key's first message, as a
// broker does: alternately a nack (the message is not sent; the nack
// arrives asynchronously) and a return (the message is sent with a routing
// key nothing is bound to, and the broker returns it). A node that lets a
// key's second message go before its first is confirmed delivers it first.
type headFails struct {
	relay.Publisher

	mu       sync.Mutex
	tried    map[uuid.UUID]bool
	nacked   int
	returned int
	nacks    sync.WaitGroup // nacks being delivered
}

func (f *headFails) wrap(p relay.Publisher) relay.Publisher {
	f.Publisher, f.tried = p, map[uuid.UUID]bool{}
	return f
}

func (f *headFails) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	f.mu.Lock()
	fault := m.KeySeq == 1 && !f.tried[m.ID]
	f.tried[m.ID] = true
	nack := fault && (f.nacked+f.returned)%2 == 0
	switch {
	case nack:
		f.nacked++
		f.nacks.Add(1)
	case fault:
		f.returned++
	}
	f.mu.Unlock()
	switch {
	case nack:
		go func() {
			defer f.nacks.Done()
			settle(relay.Result{Outcome: relay.Nacked, Err: errors.New("injected nack")})
		}()
		return nil
	case fault:
		bad := *m
		bad.RoutingKey = "unroutable." + m.RoutingKey
		err := f.Publisher.Publish(ctx, &bad, settle)
		if err != nil { // not sent: its next attempt is its first
			f.mu.Lock()
			f.returned--
			delete(f.tried, m.ID)
			f.mu.Unlock()
		}
		return err
	}
	return f.Publisher.Publish(ctx, m, settle)
}

func (f *headFails) faults() (nacked, returned int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nacked, f.returned
}

// perKeyRun commits a backlog of orders (each Placed, then Cancelled, in
// two transactions) and runs one in-process node over it whose publisher
// fails every key's first message once (headFails), with the per-key limit
// given (0: the node's own). It returns the checker's report once nothing
// is lost, the faults injected, and the database.
func perKeyRun(t *testing.T, perKeyLimit int) (testkit.Report, *headFails, *pgxpool.Pool) {
	t.Helper()
	testkit.RequireRabbitMQ(t)
	const partitions, orders = 8, 200
	ob := testkit.NewOutbox(t, partitions, 3)
	dbURL, pool := ob.URL, ob.Pool
	ex := testkit.NewExchange(t)
	checker := testkit.NewChecker(t, testkit.AMQPURL(), ex, "order.*")
	for _, typ := range []string{"placed", "cancelled"} {
		msgs := make([]outbox.Message, orders)
		for i := range msgs {
			msgs[i] = outbox.Message{CorrelationID: fmt.Sprintf("order-%d", i), Exchange: ex, RoutingKey: "order." + typ,
				Type: "order-" + typ, Payload: json.RawMessage(`{}`)}
		}
		ob.Enqueue(t, checker, msgs...)
	}
	f := &headFails{}
	t.Cleanup(f.nacks.Wait) // after the node has stopped
	startNodeWith(t, dbURL, partitions, func(c *node.Config) { c.Relay.RetryMin, c.Relay.RetryMax = 10*time.Millisecond, 50*time.Millisecond },
		nodehook.Hooks{WrapPublisher: f.wrap, PerKeyLimit: perKeyLimit})
	start := time.Now()
	rep := checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	nacked, returned := f.faults()
	t.Logf("%d messages of %d orders delivered in %v with %d nacks and %d returns injected: %s",
		rep.Distinct, orders, time.Since(start).Round(time.Millisecond), nacked, returned, rep)
	if nacked+returned != orders {
		t.Fatalf("%d faults injected, want one per order (%d)", nacked+returned, orders)
	}
	return rep, f, pool
}

// countRows counts the outbox rows matching where.
func countRows(t *testing.T, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testkit.Context(t, 10*time.Second), `SELECT count(*) FROM outbox WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNodePerKeyOrderUnderFaults: a node whose broker nacks or returns
// every key's first message once still delivers each key in order, with
// nothing lost or skipped, and each of those messages records exactly one
// failed attempt.
func TestNodePerKeyOrderUnderFaults(t *testing.T) {
	t.Parallel()
	rep, f, pool := perKeyRun(t, 0)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	testkit.WaitFor(t, 30*time.Second, "every row marked", func() bool { return countRows(t, pool, "processed_at IS NULL") == 0 })
	nacked, returned := f.faults()
	once := countRows(t, pool, "attempts = 1 AND key_seq = 1")
	if more := countRows(t, pool, "attempts > 0 AND NOT (attempts = 1 AND key_seq = 1)"); once != nacked+returned || more != 0 {
		t.Fatalf("%d first messages record one failed attempt (want %d), %d other rows record failures (want 0)", once, nacked+returned, more)
	}
}

// TestNodePerKeyLimitTwoReorders is the companion: the same run with two
// messages of a key allowed in flight delivers Cancelled before Placed,
// and the checker says so. If it did not, the test above could not fail.
func TestNodePerKeyLimitTwoReorders(t *testing.T) {
	t.Parallel()
	rep, _, _ := perKeyRun(t, 2)
	if rep.Reorders == 0 {
		t.Fatalf("per-key limit 2 under nacks and returns produced no reorder: %s", rep.Detail())
	}
}
