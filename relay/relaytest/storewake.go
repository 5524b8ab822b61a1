package relaytest

import (
	"testing"
	"time"
)

// storeNotifyDisarms: a notification disarms its partition, so an armed
// partition that takes commits at a steady rate notifies once per arm
// (each NOTIFY takes the database-wide lock in the producer's commit; at
// one per commit, 32 producers at a steady 200 commits a second queued on
// it). Notifications come in commit order: every notification of the
// commits to partition 5 arrives before that of a later commit to
// partition 7.
func storeNotifyDisarms(t *testing.T, h StoreHarness) {
	woke, stop := listen(t, h, 256, true)
	defer stop()
	// until counts the notifications of each partition until one of
	// partition want arrives.
	until := func(want int) map[int]int {
		t.Helper()
		seen := map[int]int{}
		deadline := time.After(30 * time.Second)
		for {
			select {
			case p := <-woke:
				seen[p]++
				if p == want {
					return seen
				}
			case <-deadline:
				t.Fatalf("no wake-up for partition %d (seen %v)", want, seen)
			}
		}
	}
	arm := func(p int) {
		t.Helper()
		if got, err := h.Store().Arm(ctxFor(t), []int{p}); err != nil || len(got) != 1 || got[0] != p {
			t.Fatalf("Arm(%d) = %v, %v", p, got, err)
		}
	}
	until(-1)
	const steady, every = 20, 5 * time.Millisecond
	for round := 1; round <= 2; round++ {
		arm(5)
		h.Insert(t, 5, "first")
		until(5)
		for range steady {
			h.Insert(t, 5, "steady")
			time.Sleep(every)
		}
		arm(7)
		h.Insert(t, 7, "marker")
		if n := until(7)[5]; n > 0 {
			t.Fatalf("round %d: after its first notification, %d of %d commits to partition 5 (one every %v) notified too: "+
				"a notification must disarm its partition (one NOTIFY per arm)", round, n, steady, every)
		}
	}
}
