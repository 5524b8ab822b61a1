package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// holdCommitDB is a pool whose transactions signal inCommit when Commit
// is called and then wait for hold to close.
type holdCommitDB struct {
	*pgxpool.Pool
	inCommit chan struct{}
	hold     chan struct{}
}

func (d *holdCommitDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &holdTx{Tx: tx, d: d}, nil
}

// SendBatch holds the commit of a transaction a batch begins, as Begin's.
func (d *holdCommitDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return holdBatch{BatchResults: d.Pool.SendBatch(ctx, b), d: d}
}

type holdBatch struct {
	pgx.BatchResults
	d *holdCommitDB
}

func (b holdBatch) Tx() pgx.Tx {
	if tx := b.BatchResults.Tx(); tx != nil {
		return &holdTx{Tx: tx, d: b.d}
	}
	return nil
}

type holdTx struct {
	pgx.Tx
	d *holdCommitDB
}

func (t *holdTx) Commit(ctx context.Context) error {
	t.d.inCommit <- struct{}{}
	<-t.d.hold
	return t.Tx.Commit(ctx)
}

// TestFenceLetsRenewalsPass: a handler transaction between its fenced
// advance and its commit does not hold up its lease's renewal (an update
// of expires_at), but still keeps a claim (the claim statement, by the
// lease's own owner after a restart, rolled back) off the lease row until
// it commits.
func TestFenceLetsRenewalsPass(t *testing.T) {
	_, pool := newDB(t)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `INSERT INTO ordo_inbox_leases (consumer, shard, owner, epoch, expires_at)
		VALUES ('t', 0, 'a', 1, now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	db := &holdCommitDB{Pool: pool, inCommit: make(chan struct{}), hold: make(chan struct{})}
	s := newStore(t, inbox.LocalConfig("t"), db, nil)
	type result struct {
		out inbox.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := s.Handle(ctx, inbox.Fence{Shard: 0, Owner: "a", Epoch: 1}, msg("k", 1, 0), recordHandler("a"))
		done <- result{out, err}
	}()
	released := false
	release := func() {
		if !released {
			released = true
			close(db.hold)
		}
	}
	defer release()
	select {
	case <-db.inCommit:
	case r := <-done:
		t.Fatalf("Handle returned before its commit: %v %v", r.out, r.err)
	case <-ctx.Done():
		t.Fatal("no commit within 30s")
	}
	renew := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE ordo_inbox_leases SET expires_at = now() + interval '1 minute'
			WHERE consumer = 't' AND shard = 0 AND owner = 'a' AND epoch = 1`); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := renew(); err != nil {
		t.Fatalf("renewal while a handler transaction commits: %v", err)
	}
	claimable := func() bool {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var shard, epoch int64
		err = tx.QueryRow(ctx, inbox.SQLClaimShards, "t", "a", 60, []int32{0}).Scan(&shard, &epoch)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return err == nil // rolled back: the claim only tried
	}
	if claimable() {
		t.Fatal("a claim could lock the lease row while a handler transaction under it commits")
	}
	release()
	r := <-done
	if r.err != nil || r.out != inbox.Handled {
		t.Fatalf("Handle: %v %v", r.out, r.err)
	}
	if !claimable() {
		t.Fatal("the lease row stayed locked after the commit")
	}
	checkOnceInOrder(t, handledSeqs(t, pool), map[string]int64{"k": 1})
}
