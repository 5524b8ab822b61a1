package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/outage"
	"github.com/ordo-relay/ordo/relay"
)

// Lease is the relay's lease type; the Leaser hands them out.
type Lease = relay.Lease

// LeaserConfig configures a Leaser.
type LeaserConfig struct {
	// Node is this node's name, stored as the lease owner.
	Node string
	// TTL is how long a claim or renewal holds a lease in the database.
	TTL time.Duration
	// Margin is subtracted from the local deadline so that a node stops
	// publishing before any other node can claim the lease. Default TTL/4.
	Margin time.Duration
	// RenewEvery is the renewal period. Default TTL/3.
	RenewEvery time.Duration
	// Want returns the partitions this node should hold. The single-node
	// relay wants them all; the cluster computes them from membership.
	Want func() []int
	// Connect opens the leaser's dedicated connection.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Drained reports whether the relay has nothing in flight for a
	// partition (published and not yet marked). A partition no longer
	// wanted is released once it is drained, or after HandoffTimeout,
	// whichever comes first. Nil: release at once.
	Drained func(partition int) bool
	// HandoffTimeout bounds the wait for Drained. Default TTL/2.
	HandoffTimeout time.Duration
	// Wake, when signalled, makes the leaser act on Want at once instead
	// of at the next renewal (e.g. on a membership change).
	Wake <-chan struct{}
	// Logger receives claim, loss and outage messages.
	Logger *slog.Logger
}

func (c *LeaserConfig) setDefaults() error {
	if c.Node == "" {
		return errors.New("leaser: node name is required")
	}
	if c.TTL <= 0 {
		return fmt.Errorf("leaser: TTL %v must be positive", c.TTL)
	}
	if c.Margin <= 0 {
		c.Margin = c.TTL / 4
	}
	if c.RenewEvery <= 0 {
		c.RenewEvery = c.TTL / 3
	}
	if c.Margin >= c.TTL || c.RenewEvery >= c.TTL-c.Margin {
		return fmt.Errorf("leaser: renew period %v and margin %v must fit in TTL %v", c.RenewEvery, c.Margin, c.TTL)
	}
	if c.HandoffTimeout <= 0 {
		c.HandoffTimeout = c.TTL / 2
	}
	if c.Drained == nil {
		c.Drained = func(int) bool { return true }
	}
	if c.Want == nil || c.Connect == nil {
		return errors.New("leaser: Want and Connect are required")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Leaser claims, renews and releases partition leases in the ordo_leases
// table on one dedicated connection.
type Leaser struct {
	cfg     LeaserConfig
	changed chan struct{}

	lastRenew time.Time // owned by Run
	lastWant  []int     // owned by Run: the wanted set of the previous tick

	mu       sync.Mutex
	leases   map[int]Lease
	revoking map[int]time.Time // held, no longer wanted: draining since
	handoffs []Handoff
	stats    LeaserStats
}

// LeaserStats are a Leaser's running totals since it started.
type LeaserStats struct {
	// Claims counts leases claimed (each partition once per claim).
	Claims int64
	// RenewalFailures counts renewal rounds that failed (the database did
	// not answer); Losses counts leases a renewal found held by another
	// node or epoch.
	RenewalFailures, Losses int64
	// Handoffs counts leases released because they were no longer wanted;
	// HandoffTimeouts those released before their partition drained.
	Handoffs, HandoffTimeouts int64
	// Rebalances counts changes of the wanted set (the assignment).
	Rebalances int64
}

// Stats returns the running totals. Safe for concurrent use.
func (l *Leaser) Stats() LeaserStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// Handoff is one partition given back because it is no longer wanted.
type Handoff struct {
	Partition int
	Drained   bool          // false: HandoffTimeout passed first
	Took      time.Duration // from no longer wanted to released
}

var _ relay.Ownership = (*Leaser)(nil)

// NewLeaser returns a Leaser; call Run to start it.
func NewLeaser(cfg LeaserConfig) (*Leaser, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Leaser{cfg: cfg, changed: make(chan struct{}, 1), leases: map[int]Lease{}, revoking: map[int]time.Time{}}, nil
}

// Leases implements relay.Ownership. Leases being handed off are left out, so
// the relay stops reading them while their in-flight messages settle.
func (l *Leaser) Leases() map[int]Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]Lease, len(l.leases))
	for p, x := range l.leases {
		if _, ok := l.revoking[p]; !ok {
			m[p] = x
		}
	}
	return m
}

// Lease implements relay.Ownership.
func (l *Leaser) Lease(p int) (Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, revoking := l.revoking[p]; revoking {
		return Lease{}, false
	}
	x, ok := l.leases[p]
	return x, ok
}

// held returns every lease held, handoffs included.
func (l *Leaser) held() map[int]Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]Lease, len(l.leases))
	for p, x := range l.leases {
		m[p] = x
	}
	return m
}

// Handoffs returns and forgets the handoffs completed since the last call.
func (l *Leaser) Handoffs() []Handoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.handoffs
	l.handoffs = nil
	return h
}

// Changed implements relay.Ownership.
func (l *Leaser) Changed() <-chan struct{} { return l.changed }

func (l *Leaser) signal() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Run claims the wanted partitions and renews them every RenewEvery until
// ctx is cancelled; then it releases every lease it holds (with a short
// bound of its own) and returns nil. Stop the relay first, so nothing is
// published under a released lease. Database errors are logged, rate
// limited, and retried; they do not end Run.
func (l *Leaser) Run(ctx context.Context) error {
	var conn *pgx.Conn
	defer func() {
		if conn == nil || conn.IsClosed() {
			// The connection died with ctx (a cancelled query closes it);
			// releasing is worth a fresh one.
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c, err := l.cfg.Connect(cctx)
			cancel()
			if err != nil {
				if len(l.held()) > 0 {
					l.cfg.Logger.Warn("release leases: they will expire instead", "err", err)
				}
				return
			}
			conn = c
		}
		l.release(conn)
		conn.Close(context.Background())
	}()
	down := outage.New(l.cfg.Logger, "lease database")
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-l.cfg.Wake:
		}
		if conn == nil || conn.IsClosed() {
			c, err := l.cfg.Connect(ctx)
			if err != nil {
				down.Fail(err)
				t.Reset(l.cfg.RenewEvery)
				continue
			}
			conn = c
		}
		busy, err := l.tick(ctx, conn)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			down.Fail(err)
			conn.Close(context.Background())
			conn = nil
		} else {
			down.OK()
		}
		next := l.cfg.RenewEvery - time.Since(l.lastRenew)
		if busy {
			// A handoff is draining, or a wanted partition is still held
			// elsewhere: look again soon.
			next = min(next, l.cfg.TTL/20)
		}
		t.Reset(max(next, 10*time.Millisecond))
	}
}

// tick renews what is held (once per RenewEvery), hands off what is no
// longer wanted, and claims what is wanted and free. busy reports work
// that wants another tick soon.
func (l *Leaser) tick(ctx context.Context, conn *pgx.Conn) (busy bool, err error) {
	// A renewal may wait behind relay writes holding the lease rows FOR
	// SHARE; give it until half the TTL before calling the database down.
	qctx, cancel := context.WithTimeout(ctx, max(l.cfg.RenewEvery, l.cfg.TTL/2))
	defer cancel()
	want := l.cfg.Want()
	if !slices.Equal(want, l.lastWant) {
		if l.lastWant != nil {
			l.mu.Lock()
			l.stats.Rebalances++
			l.mu.Unlock()
		}
		l.lastWant = slices.Clone(want)
		if l.lastWant == nil {
			l.lastWant = []int{}
		}
	}
	wantSet := make(map[int]bool, len(want))
	for _, p := range want {
		wantSet[p] = true
	}
	if time.Since(l.lastRenew) >= l.cfg.RenewEvery {
		if err := l.renew(qctx, conn); err != nil {
			return false, err
		}
	}
	held := l.held()

	// Handoff: stop reading, let in-flight messages settle, then release.
	now := time.Now()
	var release []Lease
	var done []Handoff
	for p, x := range held {
		l.mu.Lock()
		since, revoking := l.revoking[p]
		l.mu.Unlock()
		switch {
		case wantSet[p] && revoking:
			l.mu.Lock()
			delete(l.revoking, p) // wanted again before it was released
			l.mu.Unlock()
			l.signal()
		case wantSet[p]:
		case !revoking:
			l.mu.Lock()
			l.revoking[p] = now
			l.mu.Unlock()
			l.signal()
			busy = true
		case l.cfg.Drained(p) || now.Sub(since) >= l.cfg.HandoffTimeout:
			release = append(release, x)
			done = append(done, Handoff{Partition: p, Drained: l.cfg.Drained(p), Took: now.Sub(since)})
		default:
			busy = true
		}
	}
	if len(release) > 0 {
		if err := l.releaseLeases(qctx, conn, release); err != nil {
			return false, err
		}
		l.mu.Lock()
		for _, x := range release {
			delete(l.leases, x.Partition)
			delete(l.revoking, x.Partition)
		}
		l.handoffs = append(l.handoffs, done...)
		l.stats.Handoffs += int64(len(done))
		for _, h := range done {
			if !h.Drained {
				l.stats.HandoffTimeouts++
			}
		}
		l.mu.Unlock()
		for _, h := range done {
			if !h.Drained {
				l.cfg.Logger.Warn("handoff timed out; unconfirmed rows stay pending for the next owner",
					"partition", h.Partition, "after", h.Took.Round(time.Millisecond))
			}
		}
		l.cfg.Logger.Info("leases handed off", "count", len(release))
		l.signal()
	}

	var claim []int32
	for _, p := range want {
		if _, ok := held[p]; !ok {
			claim = append(claim, int32(p))
		}
	}
	if len(claim) == 0 {
		return busy, nil
	}
	got, err := l.claim(qctx, conn, claim)
	if err != nil {
		return false, err
	}
	return busy || got < len(claim), nil
}

// renew extends every held lease and drops the ones found lost.
func (l *Leaser) renew(ctx context.Context, conn *pgx.Conn) error {
	held := l.held()
	sent := time.Now()
	if len(held) == 0 {
		l.lastRenew = sent
		return nil
	}
	parts := make([]int32, 0, len(held))
	epochs := make([]int64, 0, len(held))
	for p, x := range held {
		parts = append(parts, int32(p))
		epochs = append(epochs, x.Epoch)
	}
	rows, err := conn.Query(ctx, sqlRenew, l.cfg.Node, l.cfg.TTL.Seconds(), parts, epochs)
	if err != nil {
		l.renewalFailed()
		return fmt.Errorf("renew leases: %w", err)
	}
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		l.renewalFailed()
		return fmt.Errorf("renew leases: %w", err)
	}
	l.lastRenew = sent
	ok := make(map[int]bool, len(renewed))
	for _, p := range renewed {
		ok[int(p)] = true
	}
	var lostParts []int32
	var lostEpochs []int64
	l.mu.Lock()
	for p, x := range held {
		if ok[p] {
			x.Deadline = sent.Add(l.cfg.TTL - l.cfg.Margin)
			l.leases[p] = x
		} else {
			delete(l.leases, p)
			delete(l.revoking, p)
			lostParts = append(lostParts, int32(p))
			lostEpochs = append(lostEpochs, x.Epoch)
		}
	}
	l.stats.Losses += int64(len(lostParts))
	l.mu.Unlock()
	if len(lostParts) == 0 {
		return nil
	}
	slices.Sort(lostParts)
	l.cfg.Logger.Warn("leases lost: another node holds them now", "partitions", lostParts)
	l.signal()
	if _, err := conn.Exec(ctx, sqlRenewFailed, l.cfg.Node, lostParts, lostEpochs); err != nil {
		return fmt.Errorf("audit lost leases: %w", err)
	}
	return nil
}

func (l *Leaser) renewalFailed() {
	l.mu.Lock()
	l.stats.RenewalFailures++
	l.mu.Unlock()
}

// claim takes what it can of parts and returns how many it got.
func (l *Leaser) claim(ctx context.Context, conn *pgx.Conn, parts []int32) (int, error) {
	sent := time.Now()
	rows, err := conn.Query(ctx, sqlClaim, l.cfg.Node, l.cfg.TTL.Seconds(), parts)
	if err != nil {
		return 0, fmt.Errorf("claim leases: %w", err)
	}
	type claimed struct {
		Partition int32
		Epoch     int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimed])
	if err != nil {
		return 0, fmt.Errorf("claim leases: %w", err)
	}
	if len(got) == 0 {
		return 0, nil
	}
	l.mu.Lock()
	l.stats.Claims += int64(len(got))
	ps := make([]int, 0, len(got))
	for _, c := range got {
		l.leases[int(c.Partition)] = Lease{Partition: int(c.Partition), Epoch: c.Epoch, Deadline: sent.Add(l.cfg.TTL - l.cfg.Margin)}
		ps = append(ps, int(c.Partition))
	}
	l.mu.Unlock()
	slices.Sort(ps)
	l.cfg.Logger.Info("leases claimed", "count", len(ps), "partitions", ps)
	l.signal()
	return len(got), nil
}

func (l *Leaser) releaseLeases(ctx context.Context, conn *pgx.Conn, leases []Lease) error {
	parts := make([]int32, len(leases))
	epochs := make([]int64, len(leases))
	for i, x := range leases {
		parts[i], epochs[i] = int32(x.Partition), x.Epoch
	}
	if _, err := conn.Exec(ctx, sqlRelease, l.cfg.Node, parts, epochs); err != nil {
		return fmt.Errorf("release leases: %w", err)
	}
	return nil
}

// release gives back every held lease so another node can claim it at once.
func (l *Leaser) release(conn *pgx.Conn) {
	held := l.held()
	if len(held) == 0 {
		return
	}
	all := make([]Lease, 0, len(held))
	for _, x := range held {
		all = append(all, x)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := l.releaseLeases(ctx, conn, all)
	l.mu.Lock()
	clear(l.leases)
	l.mu.Unlock()
	l.signal()
	if err != nil {
		l.cfg.Logger.Warn("release leases: they will expire instead", "err", err)
		return
	}
	l.cfg.Logger.Info("leases released", "count", len(all))
}
