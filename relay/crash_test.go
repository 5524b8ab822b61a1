package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
)

// crashNode is an in-process node whose every link (PostgreSQL: pool,
// listener and leaser; RabbitMQ) goes through proxies of its own, so it can
// die as a killed process does: every connection reset at once, nothing
// said to anyone. Its leases are not released; they expire.
type crashNode struct {
	*node
	db, amqp *testkit.Proxy
}

func (h *harness) startCrashNode(name string, window int) *crashNode {
	h.t.Helper()
	db := testkit.NewProxy(h.t, hostPort(testkit.PostgresURL()))
	amqp := testkit.NewProxy(h.t, hostPort(testkit.AMQPURL()))
	n := h.startNode(nodeOpts{name: name, window: window, dbURL: db.URL(h.dbURL), amqpURL: amqp.URL(testkit.AMQPURL())})
	return &crashNode{node: n, db: db, amqp: amqp}
}

// crash resets every connection of the node and then stops what is left of
// it in-process: nothing it does after the cut reaches a server.
func (c *crashNode) crash() {
	c.db.Cut()
	c.amqp.Cut()
	c.stop()
}

// leaseRow is one row of ordo_leases.
type leaseRow struct {
	epoch   int64
	expires time.Time
}

// TestCrashLeasesExpireThenTakeover: a node dies mid-drain without
// releasing its leases (every link reset at once, as kill -9 does). The
// node waiting beside it claims each partition only after the database has
// let the dead node's lease expire (its last renewal + TTL), the audit says
// it took over an expired lease, the dead node released nothing, and every
// message is delivered, each key in order.
func TestCrashLeasesExpireThenTakeover(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const orders, window = 300, 64
	placed, cancelled := make([]outbox.Message, orders), make([]outbox.Message, orders)
	for i := range orders {
		key := fmt.Sprintf("order-%d", i)
		placed[i] = h.msg(key, "order.placed", "bookstore.order-placed.v1")
		cancelled[i] = h.msg(key, "order.cancelled", "bookstore.order-cancelled.v1")
	}
	h.expect(h.enqueue(placed...))
	h.expect(h.enqueue(cancelled...))
	// The victim claims every partition, but its broker link is down until
	// the heir is running beside it; then it drains, and dies mid-drain.
	victim := h.startCrashNode("victim", window)
	victim.amqp.Cut()
	ctx := testkit.Context(t, 60*time.Second)
	waitCond(t, 30*time.Second, "the victim holds every partition", func() bool {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM ordo_leases WHERE owner = 'victim'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == testPartitions
	})
	h.startNode(nodeOpts{name: "heir"})
	victim.amqp.Restore()
	h.checker.WaitDistinct(t, 100, 30*time.Second)
	victim.crash()
	crashedAt := time.Now()
	t.Logf("crashed with %d of %d messages delivered", h.checker.Report().Distinct, 2*orders)

	held := map[int]leaseRow{}
	rows, err := h.pool.Query(ctx, `SELECT partition, epoch, expires_at FROM ordo_leases WHERE owner = 'victim'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p int
		var l leaseRow
		if err := rows.Scan(&p, &l.epoch, &l.expires); err != nil {
			t.Fatal(err)
		}
		held[p] = l
	}
	rows.Close()
	if len(held) != testPartitions {
		t.Fatalf("the victim held %d partitions when it crashed, want %d", len(held), testPartitions)
	}
	h.placeAndCancel(20) // written while nobody holds the partitions

	claims := h.waitClaims(t, "heir")
	var slowest time.Duration
	for p, c := range claims {
		if !c.at.After(held[p].expires) {
			t.Fatalf("heir claimed partition %d at %v, before the victim's lease expired at %v",
				p, c.at.Format(time.StampMilli), held[p].expires.Format(time.StampMilli))
		}
		slowest = max(slowest, c.at.Sub(crashedAt))
	}
	t.Logf("every partition taken over within %v of the crash (lease TTL 2s)", slowest.Round(time.Millisecond))
	var expired, released int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event = 'expire' AND detail = 'taken over by heir'),
		count(*) FILTER (WHERE event = 'release') FROM ordo_lease_audit WHERE node = 'victim'`).Scan(&expired, &released); err != nil {
		t.Fatal(err)
	}
	if expired != testPartitions || released != 0 {
		t.Fatalf("audit of the victim: %d leases taken over expired (want %d), %d released (want 0)", expired, testPartitions, released)
	}

	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("after the crash: %s", rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	// What the victim published and had not marked is published again: at
	// most its window.
	if rep.Duplicates > window {
		t.Fatalf("%d duplicates after a crash with a window of %d", rep.Duplicates, window)
	}
	h.waitRows(30*time.Second, "every row marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
}
