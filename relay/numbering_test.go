package relay_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// TestOwnerNumberingRollingUpgrade: two nodes relay rows numbered by the
// producers' trigger; the trigger is dropped once both have recorded that
// they number rows; producers (outbox.Producer.Enqueue and the documented
// plain INSERT) go on without it, through a publisher that fails about 5 %
// of first attempts; one node stops and the other takes its partitions
// over, republishing what was numbered and not yet confirmed. Every
// message arrives, each key gap-free in key_seq order, trigger-numbered
// and owner-numbered rows of one key continuing one sequence.
func TestOwnerNumberingRollingUpgrade(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := testkit.Context(t, 120*time.Second)
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = "order-" + uuid.NewString()
	}
	total := 0
	// write enqueues one message of every key, in a transaction of its
	// own, half by plain INSERT, and expects them.
	write := func(plain bool) {
		t.Helper()
		for i, key := range keys {
			m := h.msg(key, "order.placed", fmt.Sprintf("step.%d", total))
			if !plain || i%2 == 0 {
				h.expect(h.enqueue(m))
			} else {
				id := uuid.Must(uuid.NewV7())
				if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
					VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, partition.Of(key, testPartitions), key, m.Exchange, m.RoutingKey, m.Type,
					json.RawMessage(m.Payload)); err != nil {
					t.Fatal(err)
				}
				h.checker.Expect(id.String())
			}
		}
		total += len(keys)
	}
	write(false) // a backlog numbered by the trigger
	var faulty []*faultyPublisher
	wrap := func(p relay.Publisher) relay.Publisher {
		f := newFaulty(0.05)(p).(*faultyPublisher)
		faulty = append(faulty, f)
		return f
	}
	a := h.startNode(nodeOpts{name: "a", wrapPub: wrap})
	h.startNode(nodeOpts{name: "b", wrapPub: wrap})
	write(true)
	testkit.WaitFor(t, 30*time.Second, "the trigger dropped (both nodes number rows)", func() bool {
		return outbox.DropKeySeqTrigger(ctx, h.pool) == nil
	})
	for range 3 {
		write(true)
	}
	a.stop() // b takes a's partitions over
	for range 3 {
		write(true)
	}
	rep := h.checker.WaitFor(t, 60*time.Second, func(r testkitReport) bool { return r.Lost == 0 })
	if !rep.OK() || rep.Distinct != total {
		t.Fatalf("checker (%d messages): %s", total, rep.Detail())
	}
	nacks, returns := 0, 0
	for _, f := range faulty {
		n, r := f.faults()
		nacks, returns = nacks+n, returns+r
	}
	if nacks == 0 || returns == 0 {
		t.Fatalf("the fault injector did not fire (nacks %d, returns %d): the test proves nothing", nacks, returns)
	}
	// Delivered rows are marked a little later; each keeps the owner's
	// number in the journal, or in the row where a failure record wrote
	// it, never in both.
	testkit.WaitFor(t, 30*time.Second, "every row marked", func() bool { return h.count("processed_at IS NULL") == 0 })
	journaled := "EXISTS (SELECT 1 FROM outbox_numbers AS j WHERE j.id = outbox.id)"
	if n := h.count("key_seq IS NULL AND NOT " + journaled); n != 0 {
		t.Fatalf("%d rows left unnumbered", n)
	}
	if n := h.count("key_seq IS NOT NULL AND " + journaled); n != 0 {
		t.Fatalf("%d rows numbered in the row and in the owner's journal", n)
	}
	if n := h.count("parked_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows parked", n)
	}
	t.Logf("%d messages, %d nacks and %d returns injected: %s", total, nacks, returns, rep)
}
