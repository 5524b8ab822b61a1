package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
)

// TestLeaseRowsLockedInOneOrder: the relay's writes (marks and failure
// records, which lock the node's lease rows FOR SHARE, several partitions
// at once) and the leaser's renewals, releases and claims (which lock
// several lease rows to update them) all lock ordo_leases rows in
// ascending partition order, so none of them can deadlock another
// (docs/design.md, "Lease row locks"). For 3 s, three writers (two
// marking, one recording failures) write batches of two to eight
// partitions, in descending and shuffled orders, while the leaser renews
// the same leases (in its map's order) and, after every second renewal,
// releases three of them in a shuffled order and claims them back; any
// deadlock (SQLSTATE 40P01) fails the test. Deadlocks are detected after
// 50 ms of waiting instead of 1 s when the server lets the test set
// deadlock_timeout.
func TestLeaseRowsLockedInOneOrder(t *testing.T) {
	const (
		perPart   = 64 // rows of each partition per writer
		batchPart = 2  // rows of each partition in a write
		writers   = 3
		runFor    = 3 * time.Second
	)
	rig := newLockRig(t, writers, perPart)
	ctx, l, conn, store, rows := rig.ctx, rig.l, rig.conn, rig.store, rig.rows

	var renewals, releases, writes atomic.Int64
	var mu sync.Mutex
	deadlocks := map[string]int{} // by the statement aborted
	var first string
	// check counts a deadlock and returns any other error.
	check := func(what string, err error) error {
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &pgErr) && pgErr.Code == "40P01":
			mu.Lock()
			defer mu.Unlock()
			if len(deadlocks) == 0 {
				first = fmt.Sprintf("%s: %v (%s)", what, err, pgErr.Detail)
			}
			deadlocks[what]++
			return nil
		default:
			return fmt.Errorf("%s: %w", what, err)
		}
	}

	stop := make(chan struct{})
	var g errgroup.Group
	g.Go(func() error {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return nil
			default:
			}
			if err := check("renew", l.RenewNow(ctx, conn)); err != nil {
				return err
			}
			renewals.Add(1)
			if i%2 != 1 {
				continue
			}
			// Release three leases, in a shuffled order, and claim them back.
			held := slices.Collect(maps.Values(l.Leases()))
			rng.Shuffle(len(held), func(a, b int) { held[a], held[b] = held[b], held[a] })
			some := held[:min(3, len(held))]
			if err := check("release", l.ReleaseNow(ctx, conn, some)); err != nil {
				return err
			}
			releases.Add(1)
			back := make([]int32, len(some))
			for j, x := range some {
				back[j] = int32(x.Partition)
			}
			if _, err := l.ClaimNow(ctx, conn, back); err != nil {
				if err := check("claim", err); err != nil {
					return err
				}
			}
		}
	})
	for w := range writers {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				// Two to eight partitions, shuffled; descending for writer 0.
				order := rng.Perm(parts)[:2+rng.IntN(parts-1)]
				if w == 0 {
					slices.Sort(order)
					slices.Reverse(order)
				}
				leases := l.Leases()
				var batch []relay.Settled
				for _, p := range order {
					for j := range batchPart {
						id := rows[w][p][(i*batchPart+j)%perPart]
						batch = append(batch, relay.Settled{ID: id, Partition: p, Epoch: leases[p].Epoch,
							Err: "refused by the test", Delay: time.Millisecond})
					}
				}
				var err error
				what := "mark"
				if w == writers-1 {
					what = "failure record"
					_, err = store.RecordFailures(ctx, batch, 1<<30)
				} else {
					_, err = store.MarkPublished(ctx, batch)
				}
				if err := check(what, err); err != nil {
					return err
				}
				writes.Add(1)
			}
		})
	}
	time.AfterFunc(runFor, func() { close(stop) })
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("in %v: %d renewals, %d release-and-claims, %d writes; deadlocks (statement aborted): %v",
		runFor, renewals.Load(), releases.Load(), writes.Load(), deadlocks)
	if len(deadlocks) > 0 {
		t.Errorf("deadlocks between the relay's writes and the leaser: %v; first: %s", deadlocks, first)
	}
	if renewals.Load() < 10 || writes.Load() < 10 {
		t.Errorf("too little ran to tell: %d renewals, %d writes", renewals.Load(), writes.Load())
	}
}

// TestReleaseAndMarkStepByStep drives the interleaving that deadlocked,
// one step at a time, for pairs of partitions (x, y) in both roles: a
// blocker transaction locks x's lease row FOR UPDATE; the leaser releases
// x and y (given in that order) and waits behind the blocker; a mark of
// rows in x and y starts and waits too; the blocker commits. When the
// release locked in its array's order and the mark in its join's, the
// release took x and waited for y while the mark held y FOR SHARE and
// waited for x: a deadlock in the 4 rounds whose x is the higher (the
// mark's plan happened to lock ascending). With both in ascending order,
// whoever waits holds nothing the other wants.
func TestReleaseAndMarkStepByStep(t *testing.T) {
	rig := newLockRig(t, 1, 1)
	deadlocks := 0
	for _, pair := range [][2]int{{0, 1}, {3, 2}, {4, 5}, {7, 6}, {1, 0}, {2, 3}, {5, 4}, {6, 7}} {
		deadlocks += releaseAndMark(t, rig, pair[0], pair[1])
	}
	if deadlocks > 0 {
		t.Errorf("%d deadlocks in 8 rounds", deadlocks)
	}
}

// releaseAndMark runs one round of TestReleaseAndMarkStepByStep and
// returns how many statements were aborted as deadlocked; the leases of x
// and y are held again, at new epochs, when it returns.
func releaseAndMark(t *testing.T, rig *lockRig, x, y int) (deadlocks int) {
	t.Helper()
	ctx := rig.ctx
	held := rig.l.Leases()
	blocker, err := rig.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var g errgroup.Group
	defer func() {
		_ = blocker.Rollback(context.Background()) // after a failure: lets the others finish
		_ = g.Wait()
	}()
	if _, err := blocker.Exec(ctx, `SELECT FROM ordo_leases WHERE partition = $1 FOR UPDATE`, x); err != nil {
		t.Fatal(err)
	}
	var releaseErr, markErr error
	g.Go(func() error {
		releaseErr = rig.l.ReleaseNow(ctx, rig.conn, []relay.Lease{held[x], held[y]})
		return nil
	})
	waitLockWaiters(t, rig.admin, 1)
	g.Go(func() error {
		_, markErr = rig.store.MarkPublished(ctx, []relay.Settled{
			{ID: rig.rows[0][x][0], Partition: x, Epoch: held[x].Epoch},
			{ID: rig.rows[0][y][0], Partition: y, Epoch: held[y].Epoch}})
		return nil
	})
	waitLockWaiters(t, rig.admin, 2)
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	_ = g.Wait()
	for what, err := range map[string]error{"release": releaseErr, "mark": markErr} {
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "40P01":
			deadlocks++
			t.Logf("partitions %d, %d: %s: %v", x, y, what, err)
		case err != nil:
			t.Fatalf("partitions %d, %d: %s: %v", x, y, what, err)
		}
	}
	rig.claim(t, int32(x), int32(y))
	return deadlocks
}

// waitLockWaiters waits until n sessions of pool's database wait for a
// lock.
func waitLockWaiters(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("%d sessions waiting for a lock", n), func() bool {
		var waiting int
		if err := pool.QueryRow(testkit.Context(t, 5*time.Second), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	})
}

// lockRig is a node's leaser, driven statement by statement on its own
// connection (not Run), holding every partition, and the node's store
// on a pool of its own, with pending rows to write.
type lockRig struct {
	ctx   context.Context
	admin *pgxpool.Pool // the database's first pool, for the test's own SQL
	l     *lease.Leaser
	conn  *pgx.Conn // the leaser's
	store *pgstore.Store
	rows  [][][]uuid.UUID // [writer][partition][i], pending
}

func newLockRig(t *testing.T, writers, perPart int) *lockRig {
	t.Helper()
	const node = "n1"
	admin := newDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	fastDeadlocks(t, admin)
	pool := testkit.NewPool(t, admin.Config().ConnString(), int32(writers))

	cfg := lease.ConfigWithTTL(time.Hour)
	cfg.Node, cfg.Want, cfg.Logger = node, all, testkit.Logger(t, slog.LevelError)
	cfg.Connect = func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.ConnectConfig(ctx, admin.Config().ConnConfig.Copy())
	}
	l, err := lease.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cfg.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	rig := &lockRig{ctx: ctx, admin: admin, l: l, conn: conn,
		store: pgstore.New(pool, node, testkit.Logger(t, slog.LevelError)), rows: writerRows(t, admin, writers, perPart)}
	ps := make([]int32, parts)
	for p := range ps {
		ps[p] = int32(p)
	}
	rig.claim(t, ps...)
	return rig
}

// claim claims ps back for the rig's node and fails the test unless it
// got every one.
func (r *lockRig) claim(t *testing.T, ps ...int32) {
	t.Helper()
	if n, err := r.l.ClaimNow(r.ctx, r.conn, ps); err != nil || n != len(ps) {
		t.Fatalf("claim %v: got %d, %v", ps, n, err)
	}
}

// fastDeadlocks makes PostgreSQL look for deadlocks after 50 ms of waiting
// (1 s by default) in new sessions of pool's database, when the test's
// user may set deadlock_timeout (a superuser setting); otherwise the test
// runs with the server's setting, and finds fewer.
func fastDeadlocks(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET deadlock_timeout = '50ms'`); err != nil {
		t.Logf("deadlock_timeout left as the server has it: %v", err)
	}
}

// writerRows inserts perPart pending rows in every partition for each of
// writers writers, and returns their ids: [writer][partition][i].
func writerRows(t *testing.T, pool *pgxpool.Pool, writers, perPart int) [][][]uuid.UUID {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	out := make([][][]uuid.UUID, writers)
	for w := range out {
		out[w] = make([][]uuid.UUID, parts)
		for p := range out[w] {
			rows, err := pool.Query(ctx, `INSERT INTO outbox (id, partition, correlation_id, exchange, routing_key, type, payload)
				SELECT gen_random_uuid(), $1::int, format('w%s-p%s-%s', $2::int, $1::int, g), 'ex', 'rk', 't', '{}'
				FROM generate_series(1, $3) AS g RETURNING id`, p, w, perPart)
			if err != nil {
				t.Fatal(err)
			}
			if out[w][p], err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}
