package inbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/partition"
)

// shardLease is one shard held by this instance.
type shardLease struct {
	Shard int
	Epoch int64
	// Deadline is the local instant after which the instance stops
	// handling the shard: when it sent its last successful claim or
	// renewal, plus the TTL, minus the timing rule's Margin (a quarter of
	// it).
	Deadline time.Time
}

func (l shardLease) fence(owner string) Fence {
	return Fence{Shard: l.Shard, Owner: owner, Epoch: l.Epoch}
}

const (
	// sqlHeartbeat keeps this instance's member row alive for a TTL.
	sqlHeartbeat = `
INSERT INTO ordo_inbox_members (consumer, instance, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3))
ON CONFLICT (consumer, instance) DO UPDATE SET expires_at = excluded.expires_at`

	// sqlLive lists the members whose heartbeat has not expired.
	sqlLive = `SELECT instance FROM ordo_inbox_members WHERE consumer = $1 AND expires_at > now()`

	// sqlLeave removes this instance's member row.
	sqlLeave = `DELETE FROM ordo_inbox_members WHERE consumer = $1 AND instance = $2`

	// sqlClaimShards takes the free or expired leases among $4 (and this
	// instance's own, after a restart under the same name), bumping the
	// epoch so writes under any earlier epoch are refused. FOR UPDATE is
	// what makes the claim wait for the fenced writes in flight (they hold
	// the row FOR KEY SHARE, which the UPDATE alone would not wait for);
	// SKIP LOCKED: a lease row locked by a commit in flight is tried again
	// next tick.
	sqlClaimShards = `
UPDATE ordo_inbox_leases l
SET owner = $2, epoch = l.epoch + 1, expires_at = now() + make_interval(secs => $3), claimed_at = now()
FROM (
    SELECT shard FROM ordo_inbox_leases
    WHERE consumer = $1 AND shard = ANY($4::int[])
      AND (owner IS NULL OR owner = $2 OR expires_at < now())
    FOR UPDATE SKIP LOCKED
) c
WHERE l.consumer = $1 AND l.shard = c.shard
RETURNING l.shard, l.epoch`

	// sqlRenewShards extends the leases still held at their epoch.
	sqlRenewShards = `
UPDATE ordo_inbox_leases l SET expires_at = now() + make_interval(secs => $3)
FROM unnest($4::int[], $5::bigint[]) AS h(shard, epoch)
WHERE l.consumer = $1 AND l.shard = h.shard AND l.epoch = h.epoch AND l.owner = $2
RETURNING l.shard`

	// sqlReleaseShards frees leases still held at their epoch.
	sqlReleaseShards = `
UPDATE ordo_inbox_leases l SET owner = NULL, expires_at = '-infinity'
FROM unnest($3::int[], $4::bigint[]) AS h(shard, epoch)
WHERE l.consumer = $1 AND l.shard = h.shard AND l.epoch = h.epoch AND l.owner = $2`
)

// heartbeat refreshes this instance's member row and returns the shards it
// should own: partition.Assign of the S shards over the live members, so
// every instance computes the same balanced map from the same rows.
func (c *Consumer) heartbeat(ctx context.Context) ([]int, error) {
	ttl := c.cfg.LeaseTTL.Seconds()
	if _, err := c.lease.db(c.db).Exec(ctx, sqlHeartbeat, c.cfg.Name, c.cfg.Instance, ttl); err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	rows, err := c.lease.db(c.db).Query(ctx, sqlLive, c.cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("read live members: %w", err)
	}
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read live members: %w", err)
	}
	if !slices.Contains(live, c.cfg.Instance) {
		live = append(live, c.cfg.Instance)
	}
	a, err := partition.Assign(live, c.cfg.Shards)
	if err != nil {
		return nil, fmt.Errorf("assign shards: %w", err)
	}
	return a.Owned(c.cfg.Instance), nil
}

// renew extends every held lease and returns the shards found lost.
func (c *Consumer) renew(ctx context.Context, held map[int]shardLease) (lost []int, err error) {
	if len(held) == 0 {
		return nil, nil
	}
	shards := make([]int32, 0, len(held))
	epochs := make([]int64, 0, len(held))
	for s, l := range held {
		shards = append(shards, int32(s))
		epochs = append(epochs, l.Epoch)
	}
	sent := time.Now()
	rows, err := c.lease.db(c.db).Query(ctx, sqlRenewShards, c.cfg.Name, c.cfg.Instance, c.cfg.LeaseTTL.Seconds(), shards, epochs)
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	ok := map[int]bool{}
	for _, s := range renewed {
		ok[int(s)] = true
	}
	for s, l := range held {
		if ok[s] {
			l.Deadline = c.deadline(sent)
			held[s] = l
		} else {
			lost = append(lost, s)
		}
	}
	slices.Sort(lost)
	return lost, nil
}

// claim takes what it can of shards.
func (c *Consumer) claim(ctx context.Context, shards []int) ([]shardLease, error) {
	ss := make([]int32, len(shards))
	for i, s := range shards {
		ss[i] = int32(s)
	}
	sent := time.Now()
	rows, err := c.lease.db(c.db).Query(ctx, sqlClaimShards, c.cfg.Name, c.cfg.Instance, c.cfg.LeaseTTL.Seconds(), ss)
	if err != nil {
		return nil, fmt.Errorf("claim leases: %w", err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (shardLease, error) {
		var l shardLease
		var s int32
		err := r.Scan(&s, &l.Epoch)
		l.Shard, l.Deadline = int(s), c.deadline(sent)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim leases: %w", err)
	}
	return got, nil
}

func (c *Consumer) release(ctx context.Context, ls []shardLease) error {
	if len(ls) == 0 {
		return nil
	}
	shards := make([]int32, len(ls))
	epochs := make([]int64, len(ls))
	for i, l := range ls {
		shards[i], epochs[i] = int32(l.Shard), l.Epoch
	}
	if _, err := c.db.Exec(ctx, sqlReleaseShards, c.cfg.Name, c.cfg.Instance, shards, epochs); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

func (c *Consumer) deadline(sent time.Time) time.Time {
	return sent.Add(c.timing.TTL - c.timing.Margin)
}

// leaseConn is the lease loop's own connection, held from the pool for as
// long as the loop runs, so that a heartbeat, renewal or claim never
// waits for a connection behind the lanes: waiting, it outlasted its
// bound under load and the instance's leases expired locally (117-139
// redeliveries in a bench run of three instances with 20 ms handlers,
// with idle connections in the pool when the renewal gave up). Only the
// lease loop's goroutine uses it; a release (retire's goroutines) and
// the stop go through the pool. Without a *pgxpool.Pool (a DB of the
// caller's), or with a pool of laneReserve connections or fewer (where
// holding one would leave the lanes none), the loop uses the DB.
type leaseConn struct {
	pool *pgxpool.Pool // nil: no connection of its own
	conn *pgxpool.Conn
}

// refresh acquires the connection when there is none or it broke; on a
// failure the loop uses the pool until the next tick tries again.
func (l *leaseConn) refresh(ctx context.Context) {
	if l.pool == nil || (l.conn != nil && !l.conn.Conn().IsClosed()) {
		return
	}
	l.close()
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if conn, err := l.pool.Acquire(actx); err == nil {
		l.conn = conn
	}
}

// db returns the connection, or fallback without one.
func (l *leaseConn) db(fallback DB) DB {
	if l.conn == nil || l.conn.Conn().IsClosed() {
		return fallback
	}
	return l.conn
}

// close gives the connection back to the pool.
func (l *leaseConn) close() {
	if l.conn != nil {
		l.conn.Release()
		l.conn = nil
	}
}
