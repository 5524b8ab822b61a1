package relay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/relay"
)

// TestPerKeyOrderUnderFaults: 1,000 orders, each cancelled at once, through
// a publisher that nacks or returns about 5 % of first attempts. Every
// Placed arrives before its Cancelled, key_seq is contiguous, message-id is
// the outbox id, nothing is lost.
func TestPerKeyOrderUnderFaults(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const orders = 1000
	h.placeAndCancel(orders / 2) // a backlog: both rows of a key are readable together
	var faulty *faultyPublisher
	h.startNode(nodeOpts{wrapPub: func(p relay.Publisher) relay.Publisher {
		faulty = newFaulty(0.05)(p).(*faultyPublisher)
		return faulty
	}})
	h.placeAndCancel(orders / 2) // and rows committed while the relay runs

	start := time.Now()
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkitReport) bool { return r.Lost == 0 })
	t.Logf("all %d messages delivered in %v: %s", 2*orders, time.Since(start).Round(time.Millisecond), rep)
	nacked, returned := faulty.faults()
	t.Logf("injected %d nacks and %d returns", nacked, returned)
	if nacked == 0 || returned == 0 {
		t.Fatalf("the fault injector did not fire (nacks %d, returns %d): the test proves nothing", nacked, returned)
	}
	if !rep.OK() || rep.Distinct != 2*orders {
		t.Fatalf("checker: %s", rep.Detail())
	}
	// Placed before Cancelled, per order, by first delivery.
	first := map[string]string{}
	seen := map[string]bool{}
	for _, d := range h.checker.Deliveries() {
		if seen[d.MessageID] {
			continue
		}
		seen[d.MessageID] = true
		if _, ok := first[d.CorrelationID]; !ok {
			first[d.CorrelationID] = d.Type
		}
	}
	for key, typ := range first {
		if !strings.Contains(typ, "placed") {
			t.Fatalf("order %s: first delivery was %s", key, typ)
		}
	}
	h.waitRows(30*time.Second, "all rows marked", func(n int) bool { return n == 0 }, "processed_at IS NULL")
	// Each fault fails a message's first attempt, and nothing else fails:
	// exactly that many rows record one failed attempt, and none two.
	nacked, returned = faulty.faults()
	if once, more := h.count("attempts = 1"), h.count("attempts > 1"); once != nacked+returned || more != 0 {
		t.Errorf("%d rows record one failed attempt and %d more than one; %d nacks and %d returns were injected",
			once, more, nacked, returned)
	}
}

// TestPerKeyLimitTwoReorders is the companion: the same run with two
// messages of a key allowed in flight must reorder, and the checker must
// say so. If it does not, the ordering test above could not fail either.
func TestPerKeyLimitTwoReorders(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const orders = 1000
	h.placeAndCancel(orders)
	h.startNode(nodeOpts{perKey: 2, wrapPub: newFaulty(0.05)})
	rep := h.checker.WaitFor(t, 30*time.Second, func(r testkitReport) bool { return r.Lost == 0 })
	t.Logf("with per-key limit 2: %s", rep)
	if rep.Reorders == 0 {
		t.Fatalf("per-key limit 2 under faults produced no reorder; the checker or the fault injector is broken: %s", rep.Detail())
	}
}
