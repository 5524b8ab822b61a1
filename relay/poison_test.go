package relay_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/admin"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// TestPoisonBlocksOnlyItsKey covers both kinds of poison: a message to an
// exchange that does not exist and one with no matching binding. Each is
// parked after 5 attempts with its error, its key's later messages wait,
// every other key flows; retry after the fix delivers the whole key in
// order, and skip releases a key with the gap shown in x-ordo-prev-key-seq.
func TestPoisonBlocksOnlyItsKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	missing := testkit.UniqueName(t, "later")
	// Key "nobind": routing key nothing is bound to yet.
	var nobind []uuid.UUID
	for range 3 {
		nobind = append(nobind, h.enqueue(h.msg("nobind", "late.bound", "t.v1"))...)
	}
	// Key "noex": an exchange that does not exist yet.
	var noex []uuid.UUID
	for range 3 {
		m := h.msg("noex", "order.placed", "t.v1")
		m.Exchange = missing
		noex = append(noex, h.enqueue(m)...)
	}
	// Key "skipme": no binding, and it will be skipped.
	skipme := h.enqueue(h.msg("skipme", "never.bound", "t.v1"), h.msg("skipme", "order.placed", "t.v1"))
	h.expect(skipme[1:])

	h.startNode(nodeOpts{})
	const others = 300
	for i := range others {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("other-%d", i), "order.placed", "t.v1")))
	}
	for _, c := range []struct {
		id   uuid.UUID
		text string
	}{{nobind[0], "NO_ROUTE"}, {noex[0], "exchange not found"}, {skipme[0], "NO_ROUTE"}} {
		h.waitRows(30*time.Second, "parked after 5 attempts: "+c.text, func(n int) bool { return n == 1 },
			"id = $1 AND parked_at IS NOT NULL AND attempts = 5 AND last_error LIKE '%' || $2 || '%'", c.id, c.text)
	}
	rep := h.checker.WaitDistinct(t, others, 30*time.Second)
	if rep.Distinct != others || rep.Reorders != 0 {
		t.Fatalf("while parked, want exactly the %d other keys delivered: %s", others, rep)
	}
	if n := h.count("correlation_id IN ('nobind', 'noex', 'skipme') AND key_seq > 1 AND attempts > 0"); n != 0 {
		t.Fatalf("%d messages behind a parked one were tried", n)
	}
	// The rows behind them are held out of the relay's reads.
	h.waitRows(30*time.Second, "the 5 rows behind the parked ones held", func(n int) bool { return n == 5 },
		"correlation_id IN ('nobind', 'noex', 'skipme') AND key_seq > 1 AND held_behind = 1")
	ctx := testkit.Context(t, 30*time.Second)
	ops := admin.NewStore(h.pool)
	list, err := ops.ListParked(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	waiting := map[string]int64{}
	for _, p := range list {
		waiting[p.CorrelationID] = p.Waiting
	}
	if len(list) != 3 || waiting["nobind"] != 2 || waiting["noex"] != 2 || waiting["skipme"] != 1 {
		t.Fatalf("parked list %+v", list)
	}

	// Fix both, then retry: each key is delivered whole, in order.
	bindings := testkit.NewChecker(t, testkit.AMQPURL(), h.exchange, "late.bound")
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(missing, "topic", false, true, false, false, nil)
	})
	noexChecker := testkit.NewChecker(t, testkit.AMQPURL(), missing)
	who := admin.Actor{Operator: "tester", RemoteAddr: "test"}
	if err := ops.Retry(ctx, who, nobind[0]); err != nil {
		t.Fatal(err)
	}
	if n, err := ops.RetryKey(ctx, who, "noex"); err != nil || n != 1 {
		t.Fatalf("RetryKey = %d, %v", n, err)
	}
	for name, c := range map[string]*testkit.Checker{"nobind": bindings, "noex": noexChecker} {
		rep := c.WaitDistinct(t, 3, 30*time.Second)
		var seqs []int64
		for _, d := range c.Deliveries() {
			seqs = append(seqs, d.KeySeq)
		}
		if !rep.OK() || !slices.Equal(seqs, []int64{1, 2, 3}) {
			t.Fatalf("%s after retry: key_seq %v, %s", name, seqs, rep.Detail())
		}
	}

	// Skip: the key goes on, and the next message says what was skipped.
	if err := ops.Skip(ctx, who, skipme[0]); err != nil {
		t.Fatal(err)
	}
	h.checker.WaitDistinct(t, others+1, 30*time.Second)
	for _, d := range h.checker.Deliveries() {
		if d.MessageID == skipme[1].String() && (d.KeySeq != 2 || !d.HasPrevKeySeq || d.PrevKeySeq != 0) {
			t.Fatalf("after skipping key_seq 1: key_seq %d prev %d (has %v), want 2 and 0", d.KeySeq, d.PrevKeySeq, d.HasPrevKeySeq)
		}
	}
	if rep := h.checker.Report(); rep.Lost != 0 || rep.Reorders != 0 || rep.Gaps != 0 {
		t.Fatalf("checker: %s", rep.Detail())
	}
	if n := h.count("id = $1 AND dead_at IS NOT NULL AND processed_at IS NOT NULL", skipme[0]); n != 1 {
		t.Fatal("skipped row is not dead")
	}
	var audited int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM ordo_operator_audit WHERE operator = 'tester'`).Scan(&audited); err != nil || audited != 3 {
		t.Fatalf("operator audit rows = %d (%v), want 3", audited, err)
	}
	// Purge: the dead row's key has a later published row and none pending.
	h.waitRows(30*time.Second, "the key after the skip is marked", func(n int) bool { return n == 0 }, "id = $1 AND processed_at IS NULL", skipme[1])
	// Retention may have deleted the published row after the dead one: the
	// dead row is still purgeable.
	if _, err := h.pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, skipme[1]); err != nil {
		t.Fatal(err)
	}
	if n, err := ops.Purge(ctx, who); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1", n, err)
	}
}

// TestRetentionDeletesInChunks: processed rows past the age go, in chunks,
// while publishing continues; younger, pending and dead rows stay.
func TestRetentionDeletesInChunks(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const old = 450
	for i := range old {
		h.enqueue(h.msg(fmt.Sprintf("old-%d", i%50), "order.placed", "t.v1"))
	}
	ctx := testkit.Context(t, 30*time.Second)
	// Age them: processed two hours ago (as if published then).
	if _, err := h.pool.Exec(ctx, `UPDATE outbox SET processed_at = clock_timestamp() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	// A dead row from long ago, which retention must leave to purge.
	dead := h.enqueue(h.msg("dead", "order.placed", "t.v1"))[0]
	if _, err := h.pool.Exec(ctx, `UPDATE outbox SET processed_at = clock_timestamp() - interval '2 hours',
		dead_at = clock_timestamp() - interval '2 hours' WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	counting := &countingStore{}
	n := h.startNode(nodeOpts{retention: time.Hour, retentionChunk: 100,
		wrapStore: func(s relay.Store) relay.Store { counting.Store = s; return counting }})
	// New rows keep flowing meanwhile.
	for i := range 200 {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("new-%d", i), "order.placed", "t.v1")))
	}
	h.waitRows(30*time.Second, "old processed rows deleted", func(n int) bool { return n == 0 },
		"processed_at < clock_timestamp() - interval '1 hour' AND dead_at IS NULL")
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	if got := h.count("true"); got != 201 {
		t.Fatalf("%d rows left, want the 200 new ones and the dead one", got)
	}
	if st := n.relay.Stats(); st.Deleted != old {
		t.Fatalf("retention deleted %d, want %d", st.Deleted, old)
	}
	if max := counting.maxDeleted(); max > 100 || counting.calls() < old/100 {
		t.Fatalf("retention: %d calls, largest chunk %d; want chunks of at most 100", counting.calls(), max)
	}
}

// TestUnpublishableRowIsParked: a plain INSERT may store a header AMQP
// cannot carry (here an object). The row fails like a nack and is parked;
// it does not spin the relay, and other keys flow.
func TestUnpublishableRowIsParked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := testkit.Context(t, 30*time.Second)
	bad := uuid.Must(uuid.NewV7())
	if _, err := h.pool.Exec(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload, headers)
		VALUES ($1, $2, 'weird', $3, 'order.placed', 't', '{}', '{"nested": {"a": 1}}')`,
		bad, partition.Of("weird", testPartitions), h.exchange); err != nil {
		t.Fatal(err)
	}
	h.startNode(nodeOpts{})
	for i := range 50 {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("fine-%d", i), "order.placed", "t.v1")))
	}
	h.waitRows(30*time.Second, "the unpublishable row is parked", func(n int) bool { return n == 1 },
		"id = $1 AND parked_at IS NOT NULL AND last_error LIKE 'unpublishable row%'", bad)
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() || rep.Distinct != 50 {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

// TestChannelErrorCulpritIsParked: a message the broker refuses by closing
// the channel (here: publishing to an internal exchange, 403) is found by
// sending publishes one at a time after such a close; it fails, backs off
// and is parked, while every other key flows and is never charged.
func TestChannelErrorCulpritIsParked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	internal := testkit.UniqueName(t, "internal")
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(internal, "topic", false, false, true, false, nil)
	})
	t.Cleanup(func() {
		testkit.WithChannel(t, func(ch *amqp.Channel) error { return ch.ExchangeDelete(internal, false, false) })
	})
	m := h.msg("refused", "order.placed", "t.v1")
	m.Exchange = internal
	bad := h.enqueue(m)[0]
	h.startNode(nodeOpts{})
	const others = 200
	for i := range others {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("ok-%d", i), "order.placed", "t.v1")))
	}
	h.waitRows(30*time.Second, "the refused message is parked", func(n int) bool { return n == 1 },
		"id = $1 AND parked_at IS NOT NULL AND last_error LIKE '%ACCESS_REFUSED%'", bad)
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	if !rep.OK() || rep.Distinct != others {
		t.Fatalf("checker: %s", rep.Detail())
	}
	if n := h.count("id <> $1 AND attempts > 0", bad); n != 0 {
		t.Fatalf("%d innocent rows were charged an attempt", n)
	}
}

// TestParkedBeforeStartHoldsItsKey: a node that starts on keys parked
// before it ran (by another node, before a restart or a hand-off), their
// followers not held yet, publishes none of those followers: it reads
// them behind the parked rows, holds them, and every other key flows. A
// skip then lets each key go on, in order.
func TestParkedBeforeStartHoldsItsKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const parked, others = 20, 200
	var heads []uuid.UUID
	for i := range parked {
		key := fmt.Sprintf("parked-%d", i)
		ids := h.enqueue(h.msg(key, "order.placed", "t.v1"), h.msg(key, "order.placed", "t.v1"), h.msg(key, "order.placed", "t.v1"))
		heads = append(heads, ids[0])
		h.expect(ids[1:])
	}
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := h.pool.Exec(ctx, `UPDATE outbox SET parked_at = clock_timestamp(), attempts = 5, last_error = 'parked before the node started'
		WHERE id = ANY($1)`, heads); err != nil {
		t.Fatal(err)
	}
	for i := range others {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("other-%d", i), "order.placed", "t.v1")))
	}
	h.startNode(nodeOpts{})
	h.waitRows(30*time.Second, "the rows behind the parked ones held", func(n int) bool { return n == 2*parked },
		"correlation_id LIKE 'parked-%' AND held_behind = 1")
	rep := h.checker.WaitDistinct(t, others, 30*time.Second)
	if rep.Distinct != others {
		t.Fatalf("while parked, want exactly the %d other keys delivered: %s", others, rep)
	}
	for _, d := range h.checker.Deliveries() {
		if len(d.CorrelationID) > 7 && d.CorrelationID[:7] == "parked-" {
			t.Fatalf("a message behind a parked one was delivered: %s key_seq %d", d.CorrelationID, d.KeySeq)
		}
	}
	ops := admin.NewStore(h.pool)
	for _, id := range heads {
		if err := ops.Skip(ctx, admin.Actor{Operator: "tester", RemoteAddr: "test"}, id); err != nil {
			t.Fatal(err)
		}
	}
	h.checker.WaitDistinct(t, others+2*parked, 30*time.Second)
	if rep := h.checker.Report(); rep.Lost != 0 || rep.Reorders != 0 {
		t.Fatalf("after the skips: %s", rep.Detail())
	}
}
