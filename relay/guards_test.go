package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/partition"
)

// TestNotifyWakesWithoutPolling: with a one-minute poll, rows committed
// after the relay started arrive within seconds: the LISTEN/NOTIFY path
// works on its own. (Every other test polls every 200 ms, which would hide
// a broken wake-up.)
func TestNotifyWakesWithoutPolling(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.expect(h.enqueue(h.msg("first", "order.placed", "t.v1")))
	h.startNode(nodeOpts{pollInterval: time.Minute})
	h.checker.WaitDistinct(t, 1, 30*time.Second) // running, its first pass done
	start := time.Now()
	for i := range 20 {
		h.expect(h.enqueue(h.msg(fmt.Sprintf("later-%d", i), "order.placed", "t.v1")))
	}
	rep := h.checker.WaitDistinct(t, 21, 20*time.Second)
	t.Logf("20 rows committed after the start delivered %v after their commits began", time.Since(start).Round(time.Millisecond))
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

// TestOtherKeysFlowWhilePoisonBacksOff: a key whose message failed backs
// off for 30 s; the other keys of its partition flow meanwhile, not only
// after it is parked.
func TestOtherKeysFlowWhilePoisonBacksOff(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	poisonKey := "poison"
	p := partition.Of(poisonKey, testPartitions)
	poison := h.enqueue(h.msg(poisonKey, "unroutable.never", "t.v1"))
	h.startNode(nodeOpts{retryMin: 30 * time.Second, retryMax: time.Minute})
	h.waitRows(30*time.Second, "the poison message failed once", func(n int) bool { return n == 1 },
		"id = $1 AND attempts = 1 AND parked_at IS NULL", poison[0])
	n := 0
	for i := 0; n < 20; i++ {
		key := fmt.Sprintf("other-%d", i)
		if partition.Of(key, testPartitions) != p {
			continue
		}
		h.expect(h.enqueue(h.msg(key, "order.placed", "t.v1")))
		n++
	}
	start := time.Now()
	rep := h.checker.WaitDistinct(t, 20, 10*time.Second)
	t.Logf("20 keys of the poisoned key's partition %d delivered in %v while it backs off", p, time.Since(start).Round(time.Millisecond))
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	if got := h.count("id = $1 AND attempts = 1 AND parked_at IS NULL", poison[0]); got != 1 {
		t.Fatal("the poison message was retried or parked within its 30 s backoff")
	}
}
