package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	ordonode "github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/partition"
)

// TestSlowRowStallsOnlyItsPartition (real PostgreSQL and RabbitMQ): a row
// whose payload cannot come over the link within the read timeout (8 MiB
// at 1 MiB/s through the proxy, 1 s) stalls only its own partition. The
// read of every partition times out and splits, and every key of the other
// partitions is delivered while the row is pending; the row, read alone a
// row at a time, still times out, is charged an attempt each time (peeked
// at without its payload) and parks after MaxAttempts; then the other keys
// of its partition are delivered too, and its key's next row waits.
func TestSlowRowStallsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := testkit.Context(t, 2*time.Minute)
	const slowKey = "slow"
	slowPart := partition.Of(slowKey, testPartitions)
	slow := uuid.Must(uuid.NewV7())
	if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, headers, payload)
		VALUES ($1, $2, $3, $4, 'order.placed', 't.v1', '{}', jsonb_build_object('blob', repeat('x', 8 << 20)))`,
		slow, slowPart, slowKey, h.exchange); err != nil {
		t.Fatal(err)
	}
	next := h.enqueue(h.msg(slowKey, "order.placed", "t.v1"))[0]
	const others = 300
	inSlowPart := 0
	for i := range others {
		key := fmt.Sprintf("other-%d", i)
		if partition.Of(key, testPartitions) == slowPart {
			inSlowPart++
		}
		h.expect(h.enqueue(h.msg(key, "order.placed", "t.v1")))
	}
	db := testkit.NewProxy(t, hostPort(testkit.PostgresURL()))
	db.LimitReplies(1 << 20)
	h.startNode(nodeOpts{dbURL: db.URL(h.dbURL), leaseDBURL: h.dbURL, editConfig: func(c *ordonode.Config) {
		c.LeaseTTL, c.Relay.MaxAttempts = 2*time.Second, 3 // the read timeout is LeaseTTL/2: 1 s
	}})

	rep := h.checker.WaitDistinct(t, others-inSlowPart, 30*time.Second)
	if rep.Distinct < others-inSlowPart || rep.Reorders != 0 {
		t.Fatalf("want the %d keys of the other partitions delivered: %s", others-inSlowPart, rep)
	}
	t.Logf("the other partitions' %d keys delivered; the slow row has %d attempts",
		others-inSlowPart, h.count("id = $1 AND attempts > 0", slow))
	h.waitRows(60*time.Second, "the slow row parked", func(n int) bool { return n == 1 },
		"id = $1 AND parked_at IS NOT NULL AND attempts = 3 AND last_error LIKE '%longer than the read timeout (1s)%'", slow)
	if rep := h.checker.WaitDistinct(t, others, 30*time.Second); !rep.OK() || rep.Distinct != others {
		t.Fatalf("after the slow row parked, want all %d other keys delivered: %s", others, rep.Detail())
	}
	if n := h.count("id = $1 AND processed_at IS NULL AND attempts = 0", next); n != 1 {
		t.Fatal("the parked key's next row was tried")
	}
}
