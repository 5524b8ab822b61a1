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
)

// Lease is one partition held by this node.
type Lease struct {
	Partition int
	// Epoch is the fencing token: every relay write for the partition checks
	// that the lease row still carries it.
	Epoch int64
	// Deadline is the local, monotonic instant after which the node must
	// not publish under this lease: the time it sent its last successful
	// claim or renewal, plus the TTL, minus a safety margin.
	Deadline time.Time
}

// Valid reports whether the lease may be published under at now.
func (l Lease) Valid(now time.Time) bool { return now.Before(l.Deadline) }

// Ownership tells a relay which partitions this node holds. Implementations
// are safe for concurrent use.
type Ownership interface {
	// Leases returns a copy of the leases held now, by partition.
	Leases() map[int]Lease
	// Changed is signalled (non-blocking, coalesced) whenever the held set
	// or an epoch changes.
	Changed() <-chan struct{}
}

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

	mu     sync.Mutex
	leases map[int]Lease
}

var _ Ownership = (*Leaser)(nil)

// NewLeaser returns a Leaser; call Run to start it.
func NewLeaser(cfg LeaserConfig) (*Leaser, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Leaser{cfg: cfg, changed: make(chan struct{}, 1), leases: map[int]Lease{}}, nil
}

// Leases implements Ownership.
func (l *Leaser) Leases() map[int]Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]Lease, len(l.leases))
	for p, x := range l.leases {
		m[p] = x
	}
	return m
}

// Changed implements Ownership.
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
		if conn != nil {
			l.release(conn)
			conn.Close(context.Background())
		}
	}()
	down := outage.New(l.cfg.Logger, "lease database")
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
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
		if err := l.tick(ctx, conn); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			down.Fail(err)
			conn.Close(context.Background())
			conn = nil
		} else {
			down.OK()
		}
		t.Reset(l.cfg.RenewEvery)
	}
}

// tick renews what is held, drops what is lost or no longer wanted, and
// claims what is wanted and free.
func (l *Leaser) tick(ctx context.Context, conn *pgx.Conn) error {
	qctx, cancel := context.WithTimeout(ctx, l.cfg.RenewEvery)
	defer cancel()
	held := l.Leases()
	want := l.cfg.Want()
	wantSet := make(map[int]bool, len(want))
	for _, p := range want {
		wantSet[p] = true
	}
	// Renew everything held, then give back what is no longer wanted (the
	// cluster's handoff waits for the relay first; see Release).
	if len(held) > 0 {
		parts := make([]int32, 0, len(held))
		epochs := make([]int64, 0, len(held))
		for p, x := range held {
			parts = append(parts, int32(p))
			epochs = append(epochs, x.Epoch)
		}
		sent := time.Now()
		rows, err := conn.Query(qctx, sqlRenew, l.cfg.Node, l.cfg.TTL.Seconds(), parts, epochs)
		if err != nil {
			return fmt.Errorf("renew leases: %w", err)
		}
		renewed, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("renew leases: %w", err)
		}
		ok := make(map[int]bool, len(renewed))
		for _, p := range renewed {
			ok[int(p)] = true
		}
		l.mu.Lock()
		var lost []int
		for p, x := range held {
			if ok[p] {
				x.Deadline = sent.Add(l.cfg.TTL - l.cfg.Margin)
				l.leases[p] = x
			} else {
				delete(l.leases, p)
				lost = append(lost, p)
			}
		}
		l.mu.Unlock()
		if len(lost) > 0 {
			slices.Sort(lost)
			l.cfg.Logger.Warn("leases lost: another node holds them now", "partitions", lost)
			l.signal()
		}
	}
	var claim []int32
	for _, p := range want {
		if _, ok := held[p]; !ok {
			claim = append(claim, int32(p))
		}
	}
	if len(claim) == 0 {
		return nil
	}
	sent := time.Now()
	rows, err := conn.Query(qctx, sqlClaim, l.cfg.Node, l.cfg.TTL.Seconds(), claim)
	if err != nil {
		return fmt.Errorf("claim leases: %w", err)
	}
	type claimed struct {
		Partition int32
		Epoch     int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[claimed])
	if err != nil {
		return fmt.Errorf("claim leases: %w", err)
	}
	if len(got) == 0 {
		return nil
	}
	l.mu.Lock()
	ps := make([]int, 0, len(got))
	for _, c := range got {
		l.leases[int(c.Partition)] = Lease{Partition: int(c.Partition), Epoch: c.Epoch, Deadline: sent.Add(l.cfg.TTL - l.cfg.Margin)}
		ps = append(ps, int(c.Partition))
	}
	l.mu.Unlock()
	slices.Sort(ps)
	l.cfg.Logger.Info("leases claimed", "count", len(ps), "partitions", ps)
	l.signal()
	return nil
}

// release gives back every held lease so another node can claim it at once.
func (l *Leaser) release(conn *pgx.Conn) {
	held := l.Leases()
	if len(held) == 0 {
		return
	}
	parts := make([]int32, 0, len(held))
	epochs := make([]int64, 0, len(held))
	for p, x := range held {
		parts = append(parts, int32(p))
		epochs = append(epochs, x.Epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	tag, err := conn.Exec(ctx, sqlRelease, l.cfg.Node, parts, epochs)
	l.mu.Lock()
	clear(l.leases)
	l.mu.Unlock()
	l.signal()
	if err != nil {
		l.cfg.Logger.Warn("release leases: they will expire instead", "err", err)
		return
	}
	l.cfg.Logger.Info("leases released", "count", tag.RowsAffected())
}

const (
	// sqlClaim takes free, expired or own leases, bumping the epoch so any
	// earlier holder's writes are refused from now on.
	sqlClaim = `
UPDATE ordo_leases
SET owner = $1, epoch = epoch + 1,
    expires_at = clock_timestamp() + make_interval(secs => $2),
    claimed_at = clock_timestamp()
WHERE partition = ANY($3::int[])
  AND (owner IS NULL OR owner = $1 OR expires_at < clock_timestamp())
RETURNING partition, epoch`

	// sqlRenew extends leases still held at the same epoch.
	sqlRenew = `
UPDATE ordo_leases AS l
SET expires_at = clock_timestamp() + make_interval(secs => $2)
FROM unnest($3::int[], $4::bigint[]) AS h(partition, epoch)
WHERE l.partition = h.partition AND l.epoch = h.epoch AND l.owner = $1
RETURNING l.partition`

	// sqlRelease frees leases still held at the same epoch.
	sqlRelease = `
UPDATE ordo_leases AS l
SET owner = NULL, expires_at = '-infinity'
FROM unnest($2::int[], $3::bigint[]) AS h(partition, epoch)
WHERE l.partition = h.partition AND l.epoch = h.epoch AND l.owner = $1`
)
