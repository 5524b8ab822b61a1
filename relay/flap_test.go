package relay_test

import (
	"testing"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// TestCoreHandoffFlapWaitsForEveryFlight: a
// partition is revoked with publishes unconfirmed, then taken up again
// (the Leaser's "wanted again before its release": an Assigned at the same
// epoch; or lost and claimed again at a new epoch) and revoked again before
// those publishes settle. The state that replaced the revoked one carries
// its flights: the second Revoked is acknowledged only once nothing of the
// partition, published under either state, is in flight. Before the fix
// the new state had no flights of its own and was acknowledged at once,
// and the Leaser released the lease with the publishes unconfirmed.
func TestCoreHandoffFlapWaitsForEveryFlight(t *testing.T) {
	for _, tc := range []struct {
		name      string
		again     func(c *core)
		wantMarks int64 // marks accepted once the held publishes are confirmed
	}{
		{"revoke taken back at the same epoch", func(c *core) {
			if !c.own.Keep(3) {
				t.Fatal("partition 3 was not being revoked")
			}
		}, 2},
		{"lost and claimed again at a new epoch", func(c *core) {
			c.table.Grant("n2", 3) // n1's view loses it: a Revoked without Done
			c.table.Grant("n1", 3)
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCore(t, 0, nil)
			c.pub.Hold(true)
			ids := c.store.Insert(3, "a", "b")
			c.start()
			testkit.WaitFor(t, waitTimeout, "2 held", func() bool { now, _ := c.pub.Held(); return now == 2 })
			first := c.own.Revoke(3)
			testkit.WaitFor(t, waitTimeout, "first revoke applied", func() bool { return c.r.Stats().Revoked == 1 })
			tc.again(c)
			second := c.own.Revoke(3)
			// Events are applied in order: once the idle partition's revoke
			// is acknowledged, partition 3's second one has been applied.
			waitClosed(t, "revoke of the idle partition 0 acknowledged", c.own.Revoke(0))
			for what, ch := range map[string]<-chan struct{}{"first": first, "second": second} {
				select {
				case <-ch:
					t.Fatalf("%s revoke of partition 3 acknowledged with %d publishes of it unconfirmed", what, len(c.pub.HeldMessages()))
				default:
				}
			}
			if st := c.r.Stats(); st.Revoking != 1 {
				t.Fatalf("Revoking = %d with partition 3's flights unsettled, want 1", st.Revoking)
			}
			c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
			waitClosed(t, "second revoke acknowledged", second)
			waitClosed(t, "first revoke acknowledged", first)
			st := c.r.Stats()
			if st.Marked != tc.wantMarks || st.Marked+st.Refused != 2 || st.Revoking != 0 {
				t.Fatalf("after the acknowledgement: %d marked, %d refused, Revoking %d; want %d marked of 2, Revoking 0",
					st.Marked, st.Refused, st.Revoking, tc.wantMarks)
			}
			for _, id := range ids {
				if r, _ := c.store.Get(id); r.Processed != (tc.wantMarks > 0) {
					t.Fatalf("row %s processed = %v", id, r.Processed)
				}
			}
		})
	}
}
