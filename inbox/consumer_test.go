package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestRepublishedAndReversed: the same message republished is handled
// once; k+1 published before k is stored, then both are handled in order.
func TestRepublishedAndReversed(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 4)
	r := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("k1", 1)
	pub.publish("k1", 1) // republished: same id, same key_seq
	pub.publish("k1", 2)
	pub.publish("k2", 2) // k+1 before k
	waitFor(t, 30*time.Second, "k2/2 stored", func() bool { return r.c.Stats().GapsStored == 1 })
	if got := handledSeqs(t, pool)["k2"]; len(got) != 0 {
		t.Fatalf("k2 handled %v before its first message", got)
	}
	pub.publish("k2", 1)
	pub.publish("k1", 2)
	waitHandled(t, pool, map[string]int64{"k1": 2, "k2": 2})
	waitFor(t, 30*time.Second, "duplicates counted", func() bool { return r.c.Stats().Duplicates == 2 })
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"k1": 2, "k2": 2})
	if st := r.c.Stats(); st.Handled != 4 || st.ShardsOwned != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// TestThreeInstancesBalance: instances started one after another end up
// owning about S/3 shards each, and every message is handled once in order
// across the moves.
func TestThreeInstancesBalance(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 9)
	pub := newPublisher(t, cfg.Exchange)
	want := map[string]int64{}
	publishRound := func(round int) {
		for k := range 30 {
			key := fmt.Sprintf("o%d", k)
			want[key]++
			pub.publish(key, want[key])
		}
	}
	var rs []*running
	for i, name := range []string{"a", "b", "c"} {
		rs = append(rs, startConsumer(t, cfg, name, pool, recordHandler(name)))
		publishRound(i)
		n := len(rs)
		waitFor(t, 30*time.Second, fmt.Sprintf("%d instances own 9/%d shards each", n, n), func() bool {
			total := 0
			for _, r := range rs {
				o := len(r.c.Owned())
				if o < 9/n || o > (9+n-1)/n {
					return false
				}
				total += o
			}
			return total == 9
		})
	}
	publishRound(3)
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	for _, r := range rs {
		t.Logf("owned %v", r.c.Owned())
	}
}

func TestTopologyMismatchRefused(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 4)
	ctx := testkit.Context(t, 30*time.Second)
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := inbox.InstallTopology(ctx, pool, inbox.TopologyOf(cfg)); err != nil {
		t.Fatal(err)
	}
	cfg.Shards = 8
	c, err := inbox.New(cfg, pool, recordHandler(""))
	if err != nil {
		t.Fatal(err)
	}
	var mm *inbox.TopologyMismatchError
	if err := c.Run(ctx); !errors.As(err, &mm) || mm.Installed.Shards != 4 || !errors.Is(err, inbox.ErrTopologyMismatch) {
		t.Fatalf("Run with S changed: %v", err)
	}
}

// TestInvalidMessagesDeadLettered: no correlation id or key_seq (reaches a
// shard) and no partition (caught by the alternate exchange) both end in
// the dead-letter queue; the first is counted.
func TestInvalidMessagesDeadLettered(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	r := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	waitFor(t, 30*time.Second, "shards owned", func() bool { return len(r.c.Owned()) == 2 })
	pub := newPublisher(t, cfg.Exchange)
	pub.publishRaw("", amqp.Table{"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0), "x-ordo-partition": int32(3)}, "no-corr")
	pub.publishRaw("k", amqp.Table{"x-ordo-partition": int32(3)}, "no-seq")
	pub.publishRaw("k", amqp.Table{"x-ordo-key-seq": int64(1), "x-ordo-prev-key-seq": int64(0)}, "no-partition")
	pub.publish("k", 1)
	waitHandled(t, pool, map[string]int64{"k": 1})
	waitFor(t, 30*time.Second, "3 dead letters", func() bool { return queueDepth(t, r.c.Topology().DeadQueue()) == 3 })
	if st := r.c.Stats(); st.Invalid != 2 {
		t.Fatalf("invalid %d, want 2", st.Invalid)
	}
}

// TestCrashLoopingHandlerDeadLetters: a handler failing on one key reaches
// the dead-letter queue after M attempts; only its key waits.
func TestCrashLoopingHandlerDeadLetters(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	cfg.MaxAttempts = 3
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.CorrelationID == "poison" {
			panic("handler crash")
		}
		return recordHandler("a")(ctx, tx, m)
	}
	r := startConsumer(t, cfg, "a", pool, h)
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("poison", 1)
	pub.publish("poison", 2)
	for i := range 5 {
		pub.publish(fmt.Sprintf("ok%d", i), 1)
	}
	waitFor(t, 30*time.Second, "poison dead-lettered", func() bool { return queueDepth(t, r.c.Topology().DeadQueue()) == 1 })
	want := map[string]int64{}
	for i := range 5 {
		key := fmt.Sprintf("ok%d", i)
		want[key] = 2
		pub.publish(key, 2)
	}
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	dead, err := inbox.Dead(context.Background(), pool, cfg.Name)
	if err != nil || len(dead) != 1 || dead[0].Key != "poison" || dead[0].Attempts != 3 || dead[0].Waiting != 1 {
		t.Fatalf("dead %+v %v", dead, err)
	}
	waitFor(t, 30*time.Second, "dead key gauge", func() bool { return r.c.Stats().DeadKeys == 1 })
	if st := r.c.Stats(); st.DeadLettered != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestStuckGapResolved: a gap that never fills makes its key stuck; the
// operator resolves it; the stored message is handled, and the late
// missing message is then a duplicate.
func TestStuckGapResolved(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	cfg.GapWait = 300 * time.Millisecond
	r := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("k", 1)
	pub.publish("k", 3)
	waitFor(t, 30*time.Second, "key stuck", func() bool { return r.c.Stats().StuckKeys == 1 })
	ctx := testkit.Context(t, 30*time.Second)
	stuck, err := inbox.Stuck(ctx, pool, cfg.Name, cfg.GapWait)
	if err != nil || len(stuck) != 1 || stuck[0].Key != "k" || stuck[0].Last != 1 || stuck[0].Waiting != 3 || stuck[0].Prev != 2 {
		t.Fatalf("stuck %+v %v", stuck, err)
	}
	if err := inbox.Resolve(ctx, pool, cfg.Name, "default", "k"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "k/3 handled", func() bool { return len(handledSeqs(t, pool)["k"]) == 2 })
	before := r.c.Stats().Duplicates
	pub.publish("k", 2)
	waitFor(t, 30*time.Second, "late k/2 dropped", func() bool { return r.c.Stats().Duplicates == before+1 })
	if got := handledSeqs(t, pool)["k"]; !equal(got, []int64{1, 3}) {
		t.Fatalf("handled %v, want [1 3]", got)
	}
	if err := inbox.Resolve(ctx, pool, cfg.Name, "default", "k"); !errors.Is(err, inbox.ErrNothingToResolve) {
		t.Fatalf("second resolve: %v", err)
	}
}

// TestRetentionThenOldRedelivery: after retention deleted an idle key, an
// old message of it redelivered is not handled as a new key: below the
// low-water mark, it is held dead-lettered for the operator (it could
// also be a late first delivery: see TestBelowLowWaterHeldNotDropped),
// who skips it; the key then goes on.
func TestRetentionThenOldRedelivery(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	r := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("old", 1)
	pub.publish("old", 2)
	waitHandled(t, pool, map[string]int64{"old": 2})
	ctx := testkit.Context(t, 30*time.Second)
	// Age the key instead of waiting: retention compares handled_at.
	if _, err := pool.Exec(ctx, `UPDATE ordo_inbox_keys SET handled_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	n, err := inbox.Retain(ctx, pool, cfg.Name, time.Hour)
	if err != nil || n != 1 {
		t.Fatalf("retain: %d, %v", n, err)
	}
	pub.publish("old", 1) // the old messages, redelivered
	pub.publish("old", 2)
	waitFor(t, 30*time.Second, "old redeliveries held", func() bool { return r.c.Stats().DeadLettered == 2 })
	waitFor(t, 30*time.Second, "held copies in the dead-letter queue", func() bool { return queueDepth(t, r.c.Topology().DeadQueue()) == 2 })
	if dead, err := inbox.Dead(ctx, pool, cfg.Name); err != nil || len(dead) != 2 || dead[0].Key != "old" {
		t.Fatalf("dead %+v %v, want old/1 and old/2 held", dead, err)
	}
	if err := inbox.Skip(ctx, pool, cfg.Name, "default", "old"); err != nil {
		t.Fatal(err)
	}
	// The key goes on with a message newer than the mark (the last
	// handled message's second + 1 s: AMQP timestamps have whole seconds).
	var mark time.Time
	if err := pool.QueryRow(ctx, `SELECT low_water FROM ordo_inbox_retention WHERE consumer = $1`, cfg.Name).Scan(&mark); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the clock past the low-water mark", func() bool { return !time.Now().Truncate(time.Second).Before(mark) })
	pub.publish("old", 3)
	waitHandled(t, pool, map[string]int64{"old": 3})
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"old": 3})
}

// TestTopologyRoutesPartitionToShard: a message of partition p reaches
// shard p mod S and no other queue; one without x-ordo-partition reaches
// only the dead-letter queue. (A headers binding with x-match "all" would
// pass this only by luck: it ignores x- headers and matches everything.)
func TestTopologyRoutesPartitionToShard(t *testing.T) {
	cfg := consumerConfig(t, 3)
	topo := inbox.TopologyOf(cfg)
	testkit.WithChannel(t, topo.Declare)
	checkRouting(t, topo, newPublisher(t, cfg.Exchange))
}

// checkRouting publishes one message per partition and one without
// x-ordo-partition, and checks that each reached shard p mod S only and
// the last the dead-letter queue only; it leaves the queues empty. Nothing
// may consume the queues meanwhile.
func checkRouting(t *testing.T, topo inbox.Topology, pub *publisher) {
	t.Helper()
	for p := range testPartitions {
		pub.publishRaw("k", amqp.Table{"x-ordo-partition": int64(p)}, fmt.Sprint(p))
	}
	pub.publishRaw("k", amqp.Table{}, "none")
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		for s := range topo.Shards {
			var got []int64
			for {
				d, ok, err := ch.Get(topo.ShardQueue(s), true)
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				got = append(got, d.Headers["x-ordo-partition"].(int64))
			}
			var want []int64
			for p := range testPartitions {
				if p%topo.Shards == s {
					want = append(want, int64(p))
				}
			}
			if !equal(got, want) {
				t.Errorf("shard %d received partitions %v, want %v", s, got, want)
			}
		}
		n, err := ch.QueuePurge(topo.DeadQueue(), false)
		if n != 1 {
			t.Errorf("dead-letter queue held %d, want 1", n)
		}
		return err
	})
}
