package lease_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/partition"
)

// members is a member list the test changes, as gossip would.
type members struct {
	mu    sync.Mutex
	names []string
}

func (m *members) set(names ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.names = names
}

// want is node's Want: its share of the assignment over the members.
func (m *members) want(node string) func() []int {
	return func() []int {
		m.mu.Lock()
		defer m.mu.Unlock()
		a, err := partition.Assign(m.names, parts)
		if err != nil {
			return nil
		}
		return a.Owned(node)
	}
}

// TestEventsFollowMembership: when a member joins, the leaser of the node
// that gives partitions up sends its relay a Revoked for exactly those,
// each with a Done; once acknowledged they are released, and the joining
// node's leaser claims them and sends its relay an Assigned for each, at
// the next epoch.
func TestEventsFollowMembership(t *testing.T) {
	pool := newDB(t)
	var ms members
	ms.set("n1")
	n1 := startLeaser(t, pool, "n1", time.Second, ms.want("n1"), nil)
	r1 := record(t, n1, true)
	n2 := startLeaser(t, pool, "n2", time.Second, ms.want("n2"), nil)
	r2 := record(t, n2, true)
	testkit.WaitFor(t, 30*time.Second, "n1 assigned every partition", func() bool { return len(r1.assigned()) == parts })
	before := r1.assigned()
	if got := r2.assigned(); len(got) != 0 {
		t.Fatalf("n2 assigned %v before it was a member", got)
	}

	ms.set("n1", "n2")
	n1.poke()
	n2.poke()
	a, err := partition.Assign([]string{"n1", "n2"}, parts)
	if err != nil {
		t.Fatal(err)
	}
	moving := a.Owned("n2")
	testkit.WaitFor(t, 30*time.Second, "n2 assigned its share", func() bool { return len(r2.assigned()) == len(moving) })

	var revoked []int
	for _, rv := range r1.revoked() {
		revoked = append(revoked, rv.Partition)
		if rv.Done == nil {
			t.Errorf("Revoked of partition %d has no Done: nothing would wait for the relay", rv.Partition)
		}
		if rv.Epoch != before[rv.Partition] {
			t.Errorf("Revoked of partition %d at epoch %d, assigned at %d", rv.Partition, rv.Epoch, before[rv.Partition])
		}
	}
	slices.Sort(revoked)
	if !slices.Equal(revoked, moving) {
		t.Fatalf("n1 revoked %v, want n2's share %v", revoked, moving)
	}
	for p, epoch := range r2.assigned() {
		if epoch != before[p]+1 {
			t.Errorf("n2 assigned partition %d at epoch %d, want %d (n1's + 1)", p, epoch, before[p]+1)
		}
	}
	for p, owner := range a {
		if got := leaseRow(t, pool, p).owner; got != owner {
			t.Errorf("partition %d held by %q, assigned to %q", p, got, owner)
		}
	}
	if st := n1.Stats(); st.Handoffs != int64(len(moving)) || st.HandoffTimeouts != 0 || st.Rebalances != 1 {
		t.Errorf("n1 stats %+v, want %d handoffs, none timed out, one rebalance", st, len(moving))
	}
}

// TestStuckRevokeDoesNotDelayRenewals: a relay that never acknowledges a
// Revoked, or never even receives it, delays nothing but that partition's
// release, which waits for HandoffTimeout. Every lease the node holds,
// the revoked ones included, is renewed on time meanwhile.
func TestStuckRevokeDoesNotDelayRenewals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		receive bool
	}{
		{"relay never acknowledges", true},
		{"relay never receives", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newDB(t)
			const ttl = 900 * time.Millisecond
			const handoff = 3 * ttl
			var want wanted
			want.set(0, 1, 2, 3)
			l := startLeaser(t, pool, "n1", ttl, want.get, func(c *lease.Config) { c.HandoffTimeout = handoff })
			if tc.receive {
				record(t, l, false)
			}
			testkit.WaitFor(t, 30*time.Second, "4 leases", func() bool { return len(l.Leases()) == 4 })
			want.set(0, 1)
			begun := time.Now()
			l.poke()
			testkit.WaitFor(t, 30*time.Second, "revoke begun", func() bool { _, ok := l.Lease(2); return !ok })

			last := map[int]time.Time{0: leaseRow(t, pool, 0).expires, 2: leaseRow(t, pool, 2).expires}
			renewals := map[int]int{}
			for leaseRow(t, pool, 2).owner != "" || leaseRow(t, pool, 3).owner != "" {
				if time.Since(begun) > 30*time.Second {
					t.Fatal("revoked leases not released within 30s")
				}
				if x, ok := l.Lease(0); !ok || !x.Valid(time.Now()) {
					t.Fatalf("the lease of partition 0 lapsed %v into a pending revoke", time.Since(begun))
				}
				for p := range last {
					if e := leaseRow(t, pool, p).expires; e.After(last[p]) {
						renewals[p]++
						last[p] = e
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			took := time.Since(begun)
			t.Logf("released after %v; renewals meanwhile: %v", took.Round(time.Millisecond), renewals)
			if took < handoff {
				t.Fatalf("released %v after the revoke without an acknowledgement, before the handoff timeout %v", took, handoff)
			}
			// RenewEvery is ttl/3: about 9 renewals fit in the handoff.
			for p, n := range renewals {
				if n < 5 {
					t.Errorf("partition %d renewed %d times in %v (every %v)", p, n, took.Round(time.Millisecond), ttl/3)
				}
			}
			if st := l.Stats(); st.Handoffs != 2 || st.HandoffTimeouts != 2 {
				t.Errorf("stats %+v, want 2 handoffs, both timed out", st)
			}
		})
	}
}

// TestLostLeaseAuditedByTheRenewal: a renewal that finds a lease held by
// another node or epoch records one renew-failed row at the epoch the node
// held, in the renewal's own statement, and the node drops the lease. The
// leases it still holds are renewed and not audited as lost.
func TestLostLeaseAuditedByTheRenewal(t *testing.T) {
	pool := newDB(t)
	n1 := startLeaser(t, pool, "n1", time.Second, all, nil)
	testkit.WaitFor(t, 30*time.Second, "n1 holds every partition", func() bool { return len(n1.Leases()) == parts })
	held, _ := n1.Lease(3)

	ctx := testkit.Context(t, 10*time.Second)
	if _, err := pool.Exec(ctx, `UPDATE ordo_leases SET owner = 'thief', epoch = epoch + 1,
		expires_at = clock_timestamp() + interval '1 hour' WHERE partition = 3`); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "n1 drops partition 3", func() bool {
		_, ok := n1.Lease(3)
		return !ok
	})
	// Two more renewal rounds: the kept leases must not be audited as lost.
	last, rounds := leaseRow(t, pool, 0).expires, 0
	testkit.WaitFor(t, 30*time.Second, "n1 renews partition 0 twice more", func() bool {
		if e := leaseRow(t, pool, 0).expires; e.After(last) {
			last, rounds = e, rounds+1
		}
		return rounds >= 2
	})

	rows, err := pool.Query(ctx, `SELECT partition, epoch FROM ordo_lease_audit
		WHERE node = 'n1' AND event = 'renew-failed' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type lost struct {
		p     int
		epoch int64
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lost, error) {
		var l lost
		return l, r.Scan(&l.p, &l.epoch)
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []lost{{3, held.Epoch}}; !slices.Equal(got, want) {
		t.Fatalf("renew-failed audit rows %v, want %v (partition 3 at the epoch n1 held)", got, want)
	}
	if st := n1.Stats(); st.Losses != 1 {
		t.Errorf("n1 counted %d losses, want 1", st.Losses)
	}
}
