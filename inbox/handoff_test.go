package inbox_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

// TestHandoffWaitingOnAHandlerKeepsTheOtherShards: while an instance hands
// off a shard whose handler is still running (here one that ignores its
// context), it goes on renewing its other shards' leases and handling
// their messages; the handed-off shard moves once its handler returns.
func TestHandoffWaitingOnAHandlerKeepsTheOtherShards(t *testing.T) {
	_, pool := newDB(t)
	const shards = 4
	cfg := consumerConfig(t, shards)
	ttl := cfg.LeaseTTL
	pub := newPublisher(t, cfg.Exchange)

	// The keys: slow's shard goes to b once b joins, keep's stays with a.
	both, err := partition.Assign([]string{"a", "b"}, shards)
	if err != nil {
		t.Fatal(err)
	}
	shardOf := func(key string) int { return partition.Of(key, testPartitions) % shards }
	keyOn := func(prefix string, owner string) (string, int) {
		for i := range 1000 {
			k := fmt.Sprintf("%s-%d", prefix, i)
			if slices.Contains(both.Owned(owner), shardOf(k)) {
				return k, shardOf(k)
			}
		}
		t.Fatalf("no %s key on a shard of %s", prefix, owner)
		return "", 0
	}
	slow, _ := keyOn("slow", "b")
	keep, keepShard := keyOn("keep", "a")

	entered := make(chan struct{})
	release := make(chan struct{})
	var once, releaseOnce sync.Once
	record := recordHandler("a")
	h := func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		if m.CorrelationID == slow {
			once.Do(func() {
				close(entered)
				<-release // ignores ctx: a handler that outlives its bound
			})
		}
		return record(ctx, tx, m)
	}
	a := startConsumer(t, cfg, "a", pool, h)
	testkit.WaitFor(t, 30*time.Second, "a owns every shard", func() bool { return len(a.c.Owned()) == shards })
	pub.publish(slow, 1)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the slow handler was not called within 30s")
	}

	startConsumer(t, cfg, "b", pool, recordHandler("b"))
	// Registered after both consumers: runs before their stops.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	ctx := testkit.Context(t, 30*time.Second)
	var joined time.Time
	testkit.WaitFor(t, 30*time.Second, "b's member row", func() bool {
		err := pool.QueryRow(ctx, `SELECT now() FROM ordo_inbox_members WHERE consumer = $1 AND instance = 'b'`, cfg.Name).Scan(&joined)
		return err == nil
	})
	// From a's next tick a hands off slow's shard, and waits for its
	// handler. Its other leases must still be renewed: past the one
	// renewal of that tick (which lasts to at most joined + 4/3 TTL).
	testkit.WaitFor(t, 5*ttl, "a renews keep's shard during the handoff", func() bool {
		var expires time.Time
		err := pool.QueryRow(ctx, `SELECT expires_at FROM ordo_inbox_leases WHERE consumer = $1 AND shard = $2 AND owner = 'a'`,
			cfg.Name, keepShard).Scan(&expires)
		return err == nil && expires.After(joined.Add(2*ttl))
	})
	pub.publish(keep, 1)
	pub.publish(keep, 2)
	testkit.WaitFor(t, 5*ttl, "keep handled by a while the handoff waits", func() bool {
		return len(handledSeqs(t, pool)[keep]) == 2
	})
	if got := a.c.Owned(); !slices.Contains(got, keepShard) {
		t.Fatalf("a owns %v, want keep's shard %d among them", got, keepShard)
	}

	releaseOnce.Do(func() { close(release) })
	pub.publish(slow, 2)
	want := map[string]int64{slow: 2, keep: 2}
	waitHandled(t, pool, want)
	checkOnceInOrder(t, handledSeqs(t, pool), want)
	testkit.WaitFor(t, 30*time.Second, "b owns its shards", func() bool { return len(a.c.Owned()) == len(both.Owned("a")) })
}
