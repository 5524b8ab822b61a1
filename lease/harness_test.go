package lease_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/relay"
)

// parts is the partition count of every test database.
const parts = 8

// newDB makes a database of the test's own with the lease tables (and the
// outbox) installed.
func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ob := testkit.NewOutbox(t, parts, 4)
	if err := lease.Migrate(testkit.Context(t, 30*time.Second), ob.Pool, parts); err != nil {
		t.Fatal(err)
	}
	return ob.Pool
}

// wanted is a Want the test changes as it goes.
type wanted struct {
	mu sync.Mutex
	ps []int
}

func (w *wanted) set(ps ...int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ps = slices.Sorted(slices.Values(ps))
}

func (w *wanted) get() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ps)
}

func all() []int {
	ps := make([]int, parts)
	for i := range ps {
		ps[i] = i
	}
	return ps
}

// leaser is a Leaser run by the test; stopped when the test ends.
type leaser struct {
	*lease.Leaser
	t      *testing.T
	wake   chan struct{}
	cancel context.CancelFunc
	g      errgroup.Group
	once   sync.Once
}

// startLeaser runs a Leaser named node on pool's database with a lease TTL
// of ttl, after edit (if any) has changed its Config.
func startLeaser(t *testing.T, pool *pgxpool.Pool, node string, ttl time.Duration, want func() []int, edit func(*lease.Config)) *leaser {
	t.Helper()
	connCfg := pool.Config().ConnConfig
	cfg := lease.ConfigWithTTL(ttl)
	cfg.Node, cfg.Want, cfg.Logger = node, want, testkit.Logger(t, slog.LevelWarn).With("node", node)
	cfg.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return pgx.ConnectConfig(cctx, connCfg.Copy())
	}
	wake := make(chan struct{}, 1)
	cfg.Wake = wake
	if edit != nil {
		edit(&cfg)
	}
	l, err := lease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lr := &leaser{Leaser: l, t: t, wake: wake, cancel: cancel}
	lr.g.Go(func() error { return l.Run(ctx) })
	t.Cleanup(lr.stop)
	return lr
}

// poke makes the leaser look at Want now, as a membership change does.
func (l *leaser) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *leaser) stop() {
	l.once.Do(func() {
		l.cancel()
		if err := l.g.Wait(); err != nil {
			l.t.Errorf("Leaser.Run: %v", err)
		}
	})
}

// recorder receives an Ownership's events until the test ends, and calls
// each Revoked's Done at once when ack is set.
type recorder struct {
	ack    bool
	cancel context.CancelFunc
	g      errgroup.Group

	mu  sync.Mutex
	evs []relay.Event
}

func record(t *testing.T, own relay.Ownership, ack bool) *recorder {
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder{ack: ack, cancel: cancel}
	r.g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case ev := <-own.Events():
				r.mu.Lock()
				r.evs = append(r.evs, ev)
				r.mu.Unlock()
				if rv, ok := ev.(relay.Revoked); ok && r.ack && rv.Done != nil {
					rv.Done()
				}
			}
		}
	})
	t.Cleanup(func() { cancel(); _ = r.g.Wait() })
	return r
}

// assigned returns the epoch of each partition's latest Assigned, and
// revoked the partitions revoked, in order.
func (r *recorder) assigned() map[int]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[int]int64{}
	for _, ev := range r.evs {
		if a, ok := ev.(relay.Assigned); ok {
			m[a.Lease.Partition] = a.Lease.Epoch
		}
	}
	return m
}

func (r *recorder) revoked() []relay.Revoked {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []relay.Revoked
	for _, ev := range r.evs {
		if rv, ok := ev.(relay.Revoked); ok {
			out = append(out, rv)
		}
	}
	return out
}

// row is one partition's lease as the database has it.
type row struct {
	owner   string // "" when free
	epoch   int64
	expires time.Time // zero when free
}

func leaseRow(t *testing.T, pool *pgxpool.Pool, p int) row {
	t.Helper()
	var r row
	var owner *string
	var expires *time.Time // a released lease expires at -infinity
	err := pool.QueryRow(testkit.Context(t, 10*time.Second),
		`SELECT owner, epoch, CASE WHEN isfinite(expires_at) THEN expires_at END FROM ordo_leases WHERE partition = $1`,
		p).Scan(&owner, &r.epoch, &expires)
	if err != nil {
		t.Fatal(err)
	}
	if owner != nil {
		r.owner = *owner
	}
	if expires != nil {
		r.expires = *expires
	}
	return r
}
