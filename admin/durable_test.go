package admin

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestActionsCommitSynchronously: the node hands the admin store a pool
// whose sessions run with synchronous_commit=off (the relay's marks may
// be lost in a crash); an operator's action, and the audit row of a
// refused one, must still commit durably.
func TestActionsCommitSynchronously(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewOutbox(t, 16, 1).URL
	ctx := testkit.Context(t, 30*time.Second)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off" // as the node's pool
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := NewStore(pool)
	who := Actor{Operator: "alice", RemoteAddr: "test"}

	var inAction string
	if err := s.act(ctx, who, "probe", "setting", func(tx pgx.Tx) (string, error) {
		return "probed", tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inAction)
	}); err != nil {
		t.Fatal(err)
	}
	if inAction != "on" {
		t.Errorf("an admin action ran with synchronous_commit=%s, want on", inAction)
	}

	var inRefusal string
	refused := errors.New("refused on purpose")
	err = s.act(ctx, who, "probe", "refusal", func(tx pgx.Tx) (string, error) { return "", refused })
	if !errors.Is(err, refused) {
		t.Fatalf("act: %v, want the refusal", err)
	}
	if err := s.durable(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inRefusal)
	}); err != nil {
		t.Fatal(err)
	}
	if inRefusal != "on" {
		t.Errorf("the audit of a refused action ran with synchronous_commit=%s, want on", inRefusal)
	}
	var audited int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ordo_operator_audit WHERE operator = 'alice'`).Scan(&audited); err != nil || audited != 2 {
		t.Fatalf("audit rows: %d (%v), want 2", audited, err)
	}
}
