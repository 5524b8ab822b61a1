package lease_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/pgstore"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// The tests in this file run a real relay on the real outbox, with a real
// Leaser as its Ownership, and an in-memory publisher that holds confirms
// until the test releases them.

// startRelay runs a relay of node n1 on pool's outbox until the test ends
// (it stops before a leaser started earlier).
func startRelay(t *testing.T, pool *pgxpool.Pool, own relay.Ownership, pub relay.Publisher) *relay.Relay {
	t.Helper()
	logger := testkit.Logger(t, slog.LevelWarn).With("node", "n1")
	cfg := relay.DefaultConfig()
	cfg.Node = "n1"
	cfg.PollInterval, cfg.SettleTimeout, cfg.RetentionAge, cfg.Logger = 50*time.Millisecond, 200*time.Millisecond, 0, logger
	r, err := relay.New(cfg, pgstore.New(pool, cfg.Node, logger), pub, own)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var g errgroup.Group
	g.Go(func() error { return r.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("Relay.Run: %v", err)
		}
	})
	return r
}

// enqueue commits one row of key and returns its id and partition.
func enqueue(t *testing.T, pool *pgxpool.Pool, key string) (uuid.UUID, int) {
	t.Helper()
	prod, err := outbox.NewProducer(parts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 10*time.Second)
	var ids []uuid.UUID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = prod.Enqueue(ctx, tx, outbox.Message{CorrelationID: key, Exchange: "ex", RoutingKey: "rk",
			Type: "t", Payload: json.RawMessage(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids[0], partition.Of(key, parts)
}

func processed(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) bool {
	t.Helper()
	var done bool
	if err := pool.QueryRow(testkit.Context(t, 10*time.Second),
		`SELECT processed_at IS NOT NULL FROM outbox WHERE id = $1`, id).Scan(&done); err != nil {
		t.Fatal(err)
	}
	return done
}

func without(ps []int, p int) []int {
	var out []int
	for _, x := range ps {
		if x != p {
			out = append(out, x)
		}
	}
	return out
}

// handoffRig is a leaser, a relay and a held publish of one row.
type handoffRig struct {
	pool  *pgxpool.Pool
	want  *wanted
	l     *leaser
	r     *relay.Relay
	pub   *relaytest.Publisher
	id    uuid.UUID
	p     int
	epoch int64
}

// newHandoffRig starts a leaser with handoff timeout handoff and a relay,
// and publishes one row whose confirm the publisher holds.
func newHandoffRig(t *testing.T, handoff time.Duration) *handoffRig {
	h := &handoffRig{pool: newDB(t), want: &wanted{}, pub: relaytest.NewPublisher()}
	h.want.set(all()...)
	h.l = startLeaser(t, h.pool, "n1", time.Second, h.want.get, func(c *lease.Config) { c.HandoffTimeout = handoff })
	h.pub.Hold(true)
	h.r = startRelay(t, h.pool, h.l, h.pub)
	h.id, h.p = enqueue(t, h.pool, "k")
	testkit.WaitFor(t, 30*time.Second, "the row published, its confirm held", func() bool { n, _ := h.pub.Held(); return n == 1 })
	h.epoch = leaseRow(t, h.pool, h.p).epoch
	return h
}

// revoke takes the row's partition off the wanted set, as a membership
// change does, and waits until the relay has the Revoked.
func (h *handoffRig) revoke(t *testing.T) time.Time {
	begun := time.Now()
	h.want.set(without(all(), h.p)...)
	h.l.poke()
	testkit.WaitFor(t, 30*time.Second, "the relay has the revoke", func() bool { return h.r.Stats().Revoked == 1 })
	return begun
}

// TestRevokeWaitsForConfirms: a row published and unconfirmed when its
// partition is revoked keeps the lease (renewed) until its confirm comes
// and it is marked; then the lease is released at once, not at the
// handoff timeout.
func TestRevokeWaitsForConfirms(t *testing.T) {
	h := newHandoffRig(t, time.Minute)
	h.revoke(t)
	last := leaseRow(t, h.pool, h.p).expires
	for renewals, start := 0, time.Now(); renewals < 3; {
		x := leaseRow(t, h.pool, h.p)
		if x.owner != "n1" || x.epoch != h.epoch {
			t.Fatalf("partition %d released (owner %q, epoch %d) with a publish of it unconfirmed", h.p, x.owner, x.epoch)
		}
		if x.expires.After(last) {
			renewals++
			last = x.expires
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the revoked lease was renewed %d times in 30s", renewals)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if processed(t, h.pool, h.id) {
		t.Fatal("marked before its confirm")
	}
	h.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	testkit.WaitFor(t, 30*time.Second, "the lease released", func() bool { return leaseRow(t, h.pool, h.p).owner == "" })
	if !processed(t, h.pool, h.id) {
		t.Fatal("the lease was released before the confirmed row was marked")
	}
	if st := h.l.Stats(); st.Handoffs != 1 || st.HandoffTimeouts != 0 {
		t.Fatalf("leaser stats %+v, want one handoff, acknowledged", st)
	}
}

// TestRevokeTimesOutWithoutConfirm: when the confirm never comes, the
// lease is released at the handoff timeout, not before; the row stays
// pending, and a confirm that comes after the release is not marked.
func TestRevokeTimesOutWithoutConfirm(t *testing.T) {
	const handoff = 1500 * time.Millisecond
	h := newHandoffRig(t, handoff)
	begun := h.revoke(t)
	testkit.WaitFor(t, 30*time.Second, "the lease released", func() bool { return leaseRow(t, h.pool, h.p).owner == "" })
	if took := time.Since(begun); took < handoff {
		t.Fatalf("released %v after the revoke, before the handoff timeout %v, with nothing acknowledged", took, handoff)
	}
	if st := h.l.Stats(); st.Handoffs != 1 || st.HandoffTimeouts != 1 {
		t.Fatalf("leaser stats %+v, want one handoff, timed out", st)
	}
	h.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	testkit.WaitFor(t, 30*time.Second, "the late mark refused", func() bool { return h.r.Stats().Refused == 1 })
	if processed(t, h.pool, h.id) {
		t.Fatal("a row confirmed after its lease was released was marked")
	}
}
