package inbox_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// TestLeasesRenewedWithThePoolTaken: the lease loop has a connection of
// its own, so that an instance whose every other pool connection is in
// use (lanes at work, slow handlers) still renews its leases: they stay
// its own, and are renewed, while the test holds the rest of the pool
// for three TTLs.
func TestLeasesRenewedWithThePoolTaken(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	ttl := cfg.LeaseTTL
	a := startConsumer(t, cfg, "a", pool, recordHandler("a"))
	testkit.WaitFor(t, 30*time.Second, "a owns both shards", func() bool { return len(a.c.Owned()) == 2 })
	ctx := testkit.Context(t, time.Minute)
	var since time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	var taken []*pgxpool.Conn
	defer func() {
		for _, c := range taken {
			c.Release()
		}
	}()
	for {
		actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		c, err := pool.Acquire(actx)
		cancel()
		if err != nil {
			break
		}
		taken = append(taken, c)
	}
	if len(taken) == 0 {
		t.Fatal("took none of the pool's connections")
	}
	t.Logf("holding %d of the pool's %d connections", len(taken), pool.Stat().MaxConns())
	// The renewals go on: through the lease loop's connection, which the
	// pool has not lent again.
	var expires time.Time
	testkit.WaitFor(t, 5*ttl, "a's leases renewed 3 TTLs on", func() bool {
		return taken[0].QueryRow(ctx, `SELECT min(expires_at) FROM ordo_inbox_leases WHERE consumer = $1 AND owner = 'a'`,
			cfg.Name).Scan(&expires) == nil && expires.After(since.Add(3*ttl))
	})
	if got := a.c.Owned(); len(got) != 2 {
		t.Fatalf("a owns %v with the pool taken, want both shards", got)
	}
}

// TestSmallPoolsHandle: with a pool of 1 to 3 connections an instance
// owns its shards and handles every message in order: the lease loop
// holds a connection of its own only where one is left for the lanes.
func TestSmallPoolsHandle(t *testing.T) {
	for _, conns := range []int32{1, 2, 3} {
		t.Run(fmt.Sprint(conns), func(t *testing.T) {
			url, _ := newDB(t)
			pool := testkit.NewPool(t, url, conns)
			cfg := consumerConfig(t, 2)
			startConsumer(t, cfg, "a", pool, recordHandler("a"))
			pub := newPublisher(t, cfg.Exchange)
			want := map[string]int64{}
			for i := range 20 {
				key := fmt.Sprintf("k%d", i%4)
				want[key]++
				pub.publish(key, want[key])
			}
			waitHandled(t, pool, want)
			checkOnceInOrder(t, handledSeqs(t, pool), want)
		})
	}
}
