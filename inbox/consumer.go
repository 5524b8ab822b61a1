package inbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/lease"
)

// Consumer consumes a consumer group's shard queues: it balances the S
// shards over the live instances through leases in the consumer's
// database, runs one worker per owned shard (an exclusive AMQP consumer
// with manual acks), and hands every delivery to its Store in the lane of
// its key (Config.Lanes keys of a shard at once, each key serial). Create
// it with New and run it with Run.
type Consumer struct {
	cfg    Config
	timing lease.Timing // the intervals derived from cfg.LeaseTTL
	db     DB
	h      Handler
	topo   Topology
	store  *Store
	amqp   *broker
	dead   *deadLetters

	ready    chan struct{} // closed once the topology is declared
	dbDown   *outage.Log   // handler database errors, rate-limited
	owned    atomic.Int32
	stuck    atomic.Int32
	deadKeys atomic.Int32
	invalid  atomic.Int64
	tracer   trace.Tracer // nil: tracing off

	// gate caps the lanes of all shards at work at once below the pool's
	// size, leaving the lease loop's connection and one for the retry
	// polls, and below that while handlers are fast (nil: no cap).
	gate *gate

	mu      sync.Mutex
	workers map[int]*worker // owned by Run's loop; read under mu by Owned
	retired sync.WaitGroup  // the goroutines of retire, waited for by stopAll
	lease   leaseConn       // the lease loop's own connection
}

// worker is the goroutine of one owned shard.
type worker struct {
	lease  shardLease
	cancel context.CancelFunc
	done   chan struct{}
	// retiring: told to stop (retire); the lease loop neither hands it off
	// again nor claims its shard until it has stopped and is gone.
	retiring bool
	// lost: its lease is no longer renewed (found lost, or past its local
	// deadline).
	lost bool
}

// New returns a Consumer of cfg's group that handles each message with h
// in a transaction on db (normally a *pgxpool.Pool of 2 + Lanes × the
// shards one instance may own connections; see Config.Lanes).
//
// New fills the fields of cfg left zero from DefaultConfig(cfg.Name),
// then returns every problem of the result (Config.Validate), each a
// *confcheck.Problem naming its field.
func New(cfg Config, db DB, h Handler) (*Consumer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validateConsumer(); err != nil {
		return nil, err
	}
	c := &Consumer{cfg: cfg, timing: lease.TimingFor(cfg.LeaseTTL), db: db, h: h, topo: TopologyOf(cfg), workers: map[int]*worker{}, ready: make(chan struct{}),
		dbDown: outage.New(cfg.Logger, "inbox database")}
	if cfg.TracerProvider != nil {
		c.tracer = cfg.TracerProvider.Tracer(tracerName)
		c.h = c.tracedHandler(h)
	}
	c.amqp = newBroker(cfg, c.topo)
	c.dead = newDeadLetters(cfg, c.topo)
	s, err := NewStore(cfg, db, c.dead)
	if err != nil {
		return nil, err
	}
	c.store = s
	c.gate = laneGate(db, func() time.Duration { return time.Duration(s.stats.handlerNanos.Load()) },
		func() int { return int(s.stats.inHandler.Load()) })
	return c, nil
}

// Ready is closed once Run has declared the topology on the broker: from
// then on every message published to the source exchange reaches a shard
// queue (or the dead-letter queue).
func (c *Consumer) Ready() <-chan struct{} { return c.ready }

// Topology returns the consumer's broker layout.
func (c *Consumer) Topology() Topology { return c.topo }

// Stats returns the counters and gauges. Safe for concurrent use.
func (c *Consumer) Stats() Stats {
	s := c.store.Stats()
	s.Invalid = c.invalid.Load()
	s.ShardsOwned = int(c.owned.Load())
	s.StuckKeys = int(c.stuck.Load())
	s.DeadKeys = int(c.deadKeys.Load())
	if c.gate != nil {
		s.LaneLimit = c.gate.cap()
	}
	return s
}

// Owned returns the shards this instance holds now, ascending.
func (c *Consumer) Owned() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s []int
	for i := range c.workers {
		s = append(s, i)
	}
	slices.Sort(s)
	return s
}

// Run migrates the inbox schema, checks the topology against the one
// installed (returning a *TopologyMismatchError if it differs), and
// consumes until ctx is cancelled. On cancellation it lets each shard
// worker finish the message in hand, closes its channel (the broker
// requeues prefetched deliveries), releases the leases and leaves. Outages
// of the database or broker are logged, rate limited, and retried; they do
// not end Run.
func (c *Consumer) Run(ctx context.Context) error {
	if err := Migrate(ctx, c.db); err != nil {
		return err
	}
	if err := InstallTopology(ctx, c.db, c.topo); err != nil {
		return err
	}
	defer c.amqp.close()
	defer c.dead.close()
	if err := c.connect(ctx); err != nil {
		return nil // cancelled before the broker was reachable
	}
	close(c.ready)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.supervise(gctx) })
	g.Go(func() error { c.refreshGauges(gctx); return nil })
	if c.cfg.RetentionAge > 0 {
		g.Go(func() error { c.retain(gctx); return nil })
	}
	return g.Wait()
}

// connect waits until the broker is reachable and the topology declared,
// so that nothing published after Run's start is lost for want of a
// queue. It returns ctx's error if cancelled first.
func (c *Consumer) connect(ctx context.Context) error {
	down := outage.New(c.cfg.Logger, "inbox broker")
	backoff := c.cfg.RetryMin
	for {
		_, err := c.amqp.connection()
		if err == nil {
			down.OK()
			return nil
		}
		down.Fail(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// supervise is the lease loop: every RenewEvery (LeaseTTL/3, the lease
// timing rule's, lease.Timing) it heartbeats, renews,
// hands off shards no longer wanted and claims the wanted ones.
func (c *Consumer) supervise(ctx context.Context) error {
	down := outage.New(c.cfg.Logger, "inbox lease database")
	defer c.stopAll()
	if p, ok := c.db.(*pgxpool.Pool); ok && p.Stat().MaxConns() > laneReserve {
		c.lease.pool = p
	}
	defer c.lease.close()
	// The first tick only announces this instance; claims start at the
	// second, when the instances started together see one another, so
	// that the first to start does not take every shard only to hand most
	// of them back (each handoff redelivers the prefetched messages).
	joined := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		c.lease.refresh(ctx)
		var err error
		if joined {
			err = c.tick(ctx)
		} else if _, err = c.heartbeat(ctx); err == nil {
			joined = true
		}
		if err != nil && ctx.Err() == nil {
			down.Fail(err)
		} else {
			down.OK()
		}
		t.Reset(c.timing.RenewEvery)
	}
}

func (c *Consumer) tick(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, c.timing.HandoffTimeout)
	defer cancel()
	held := c.heldLeases()
	lost, err := c.renew(qctx, held)
	if err != nil {
		c.stopExpired(time.Now())
		return err
	}
	if len(lost) > 0 {
		c.cfg.Logger.Warn("inbox: shard leases lost; stopping their workers", "shards", lost)
		c.retire(lost, true, nil)
	}
	c.updateDeadlines(held)
	want, err := c.want(qctx)
	if err != nil {
		return err
	}
	c.handOff(want)
	var missing []int
	present := c.present()
	for _, s := range want {
		if !present[s] {
			missing = append(missing, s)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	got, err := c.claim(qctx, missing)
	if err != nil {
		return err
	}
	for _, l := range got {
		c.startWorker(ctx, l)
	}
	if len(got) > 0 {
		c.cfg.Logger.Info("inbox: shards claimed", "instance", c.cfg.Instance, "shards", shardsOf(got), "owned", c.Owned())
	}
	return nil
}

// want heartbeats and returns the shards this instance should own; while
// the broker has been unreachable for longer than StallTimeout (LeaseTTL)
// it leaves the
// member list instead and wants nothing, so that instances that reach the
// broker take its shards (it would hold them uselessly), and it tries the
// broker again.
func (c *Consumer) want(ctx context.Context) ([]int, error) {
	if !c.amqp.reachable(c.timing.StallTimeout) {
		if _, err := c.amqp.connection(); err != nil {
			if _, err := c.db.Exec(ctx, sqlLeave, c.cfg.Name, c.cfg.Instance); err != nil {
				return nil, fmt.Errorf("leave: %w", err)
			}
			if len(c.Owned()) > 0 {
				c.cfg.Logger.Warn("inbox: broker unreachable; handing every shard to the other instances", "err", err)
			}
			return nil, nil
		}
	}
	return c.heartbeat(ctx)
}

// handOff retires the workers of shards no longer wanted: each finishes
// the transaction in hand under its lease, which the loop goes on renewing
// meanwhile, and its lease is released once it has stopped. The loop does
// not wait for them: a handler slow to return at a handoff must not hold
// up the renewals of every other shard (they would expire, and another
// instance take them).
func (c *Consumer) handOff(want []int) {
	c.mu.Lock()
	var rel []int
	for s, w := range c.workers {
		if !w.retiring && !slices.Contains(want, s) {
			rel = append(rel, s)
		}
	}
	c.mu.Unlock()
	slices.Sort(rel)
	c.retire(rel, false, func(l shardLease) {
		ctx, cancel := context.WithTimeout(context.Background(), c.timing.HandoffTimeout)
		defer cancel()
		if err := c.release(ctx, []shardLease{l}); err != nil {
			c.cfg.Logger.Warn("inbox: release a lease handed off: it will expire instead", "shard", l.Shard, "err", err)
			return
		}
		c.cfg.Logger.Info("inbox: shard handed off", "instance", c.cfg.Instance, "shard", l.Shard)
	})
}

// retire tells the workers of shards to stop and returns at once. A
// goroutine per worker waits for it to finish its transaction in hand,
// forgets it, then calls then (if not nil) with its lease. lost stops the
// renewals of their leases at once; otherwise they are renewed until the
// worker is gone, so that what it commits meanwhile is not refused.
func (c *Consumer) retire(shards []int, lost bool, then func(shardLease)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range shards {
		w, ok := c.workers[s]
		if !ok {
			continue
		}
		w.lost = w.lost || lost
		if w.retiring {
			continue
		}
		w.retiring = true
		w.cancel()
		c.retired.Go(func() {
			<-w.done
			c.mu.Lock()
			if c.workers[s] == w {
				delete(c.workers, s)
				c.owned.Store(int32(len(c.workers)))
			}
			l := w.lease
			c.mu.Unlock()
			if then != nil {
				then(l)
			}
		})
	}
}

// stopWorkers stops the workers of shards together and waits for them all.
func (c *Consumer) stopWorkers(shards []int) {
	var wg sync.WaitGroup
	for _, s := range shards {
		wg.Go(func() { c.stopWorker(s) })
	}
	wg.Wait()
}

// heldLeases returns the leases to renew: every worker's but those lost.
func (c *Consumer) heldLeases() map[int]shardLease {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[int]shardLease, len(c.workers))
	for s, w := range c.workers {
		if !w.lost {
			m[s] = w.lease
		}
	}
	return m
}

// present returns the shards that have a worker, retiring or not: none of
// them is claimed again until its worker is gone.
func (c *Consumer) present() map[int]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[int]bool, len(c.workers))
	for s := range c.workers {
		m[s] = true
	}
	return m
}

func (c *Consumer) updateDeadlines(held map[int]shardLease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s, l := range held {
		if w, ok := c.workers[s]; ok && w.lease.Epoch == l.Epoch {
			w.lease.Deadline = l.Deadline
		}
	}
}

// leaseValid reports whether shard's lease at epoch may still be written
// under; workers check it before each message.
func (c *Consumer) leaseValid(shard int, epoch int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.workers[shard]
	return ok && w.lease.Epoch == epoch && time.Now().Before(w.lease.Deadline)
}

// stopExpired retires the workers whose local deadline has passed (the
// database is unreachable: their leases may be claimed by now).
func (c *Consumer) stopExpired(now time.Time) {
	var expired []int
	for s, l := range c.heldLeases() {
		if !now.Before(l.Deadline) {
			c.cfg.Logger.Warn("inbox: shard lease expired locally; stopping its worker", "shard", s)
			expired = append(expired, s)
		}
	}
	c.retire(expired, true, nil)
}

func (c *Consumer) startWorker(ctx context.Context, l shardLease) {
	wctx, cancel := context.WithCancel(ctx)
	w := &worker{lease: l, cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	c.workers[l.Shard] = w
	c.owned.Store(int32(len(c.workers)))
	c.mu.Unlock()
	go func() {
		defer close(w.done)
		c.runShard(wctx, l)
	}()
}

// stopWorker tells shard's worker to stop and waits until it has.
func (c *Consumer) stopWorker(shard int) {
	c.mu.Lock()
	w, ok := c.workers[shard]
	c.mu.Unlock()
	if !ok {
		return
	}
	w.cancel()
	<-w.done
	c.mu.Lock()
	delete(c.workers, shard)
	c.owned.Store(int32(len(c.workers)))
	c.mu.Unlock()
}

// stopAll stops every worker, then releases the leases and the member row
// with a short bound of their own.
func (c *Consumer) stopAll() {
	held := c.heldLeases()
	var shards []int
	for s := range c.present() {
		shards = append(shards, s)
	}
	c.stopWorkers(shards)
	c.retired.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ls := make([]shardLease, 0, len(held))
	for _, l := range held {
		ls = append(ls, l)
	}
	if err := c.release(ctx, ls); err != nil {
		c.cfg.Logger.Warn("inbox: release leases: they will expire instead", "err", err)
	}
	if _, err := c.db.Exec(ctx, sqlLeave, c.cfg.Name, c.cfg.Instance); err != nil {
		c.cfg.Logger.Warn("inbox: leave: the member row will expire instead", "err", err)
	}
}

// refreshGauges keeps the stuck and dead key counts of Stats current.
func (c *Consumer) refreshGauges(ctx context.Context) {
	t := time.NewTicker(max(c.cfg.RetryPoll*5, time.Second))
	defer t.Stop()
	for {
		if stuck, err := Stuck(ctx, c.db, c.cfg.Name, c.cfg.GapWait); err == nil {
			c.stuck.Store(int32(len(stuck)))
		}
		var dead int32
		if err := c.db.QueryRow(ctx, `SELECT count(*) FROM ordo_inbox_messages WHERE consumer = $1 AND dead_at IS NOT NULL`,
			c.cfg.Name).Scan(&dead); err == nil {
			c.deadKeys.Store(dead)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func shardsOf(ls []shardLease) []int {
	s := make([]int, len(ls))
	for i, l := range ls {
		s[i] = l.Shard
	}
	slices.Sort(s)
	return s
}

// errLeaseExpired stops a worker whose local lease deadline passed.
var errLeaseExpired = fmt.Errorf("shard lease deadline passed: %w", ErrFenced)
