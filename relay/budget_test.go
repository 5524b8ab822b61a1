package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
)

// The tests of a Budget shared by relays (one per source of a node), on
// the fakes: each relay has its own store and publisher, which holds
// confirms, so that what each relay has in flight stands still and can be
// counted. The node-level test against the real servers is node's
// TestBusySourceDoesNotDelayAnother.

// budgetW is the node's confirm window W in these tests.
const budgetW = 16

// nodeCount counts the messages published and not yet settled over every
// relay of a node, and the most there ever were.
type nodeCount struct {
	mu        sync.Mutex
	now, most int
}

// Most returns the most messages unsettled at once.
func (n *nodeCount) Most() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.most
}

// counted is a relay's publisher counted in a nodeCount.
type counted struct {
	relay.Publisher
	n *nodeCount
}

func (c counted) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	c.n.mu.Lock()
	c.n.now++
	c.n.most = max(c.n.most, c.n.now)
	c.n.mu.Unlock()
	done := func() {
		c.n.mu.Lock()
		c.n.now--
		c.n.mu.Unlock()
	}
	err := c.Publisher.Publish(ctx, m, func(res relay.Result) {
		done()
		settle(res)
	})
	if err != nil {
		done()
	}
	return err
}

// budgetCores returns k relays on fakes sharing budget (nil: none), each
// with the confirm window window, their publishers holding confirms and
// counted in one nodeCount.
func budgetCores(t *testing.T, k, window int, budget *relay.Budget) ([]*core, *nodeCount) {
	t.Helper()
	n := &nodeCount{}
	cores := make([]*core, k)
	for i := range cores {
		c := newCore(t, 0, func(cfg *relay.Config) { cfg.Window = window })
		c.pub.Hold(true)
		c.cfg.Budget = budget // not newCore's relay's: it is replaced
		r, err := relay.New(c.cfg, c.store.ForNode(c.cfg.Node), counted{c.pub, n}, c.own)
		if err != nil {
			t.Fatal(err)
		}
		c.r = r
		cores[i] = c
	}
	return cores, n
}

func held(c *core) int { now, _ := c.pub.Held(); return now }

// drainAll stops holding confirms and waits until every core has marked
// every row, each key in order.
func drainAll(cores []*core) {
	for _, c := range cores {
		c.pub.Hold(false)
		c.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
	}
	for _, c := range cores {
		c.waitDrained()
	}
}

// TestBudgetBusySourceAloneUsesAllOfW: of two sources, one busy and one
// idle, the busy one has all of W in flight with a shared Budget, and W/2
// with the static split it replaces.
func TestBudgetBusySourceAloneUsesAllOfW(t *testing.T) {
	for _, c := range []struct {
		name   string
		window int
		budget *relay.Budget
		want   int
	}{
		{"shared budget", budgetW, relay.NewBudget(budgetW, 16<<20), budgetW},
		{"static split", budgetW / 2, nil, budgetW / 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			cores, n := budgetCores(t, 2, c.window, c.budget)
			busy := cores[0]
			busy.insert(64, 2) // 64 keys: up to 64 could be in flight
			for _, x := range cores {
				x.start()
			}
			testkit.WaitFor(t, waitTimeout, fmt.Sprintf("%d in flight", c.want), func() bool { return held(busy) == c.want })
			drainAll(cores)
			if _, most := busy.pub.Held(); most != c.want {
				t.Fatalf("the busy source had at most %d in flight, want %d", most, c.want)
			}
			if most := n.Most(); most > budgetW {
				t.Fatalf("the node had %d unconfirmed at once, W = %d", most, budgetW)
			}
		})
	}
}

// TestBudgetTwoBusySourcesShareFairly: a source that holds all of W while
// the other is idle gives the other its fair share once it has work, and
// the node never has more than W in flight.
func TestBudgetTwoBusySourcesShareFairly(t *testing.T) {
	budget := relay.NewBudget(budgetW, 16<<20)
	cores, n := budgetCores(t, 2, budgetW, budget)
	a, b := cores[0], cores[1]
	a.insert(64, 3)
	b.insert(64, 3)
	a.start()
	testkit.WaitFor(t, waitTimeout, "a has all of W in flight", func() bool { return held(a) == budgetW })
	b.start()
	testkit.WaitFor(t, waitTimeout, "a and b wait for slots", func() bool { return budget.Stats().WaitingSlot == 2 })
	for round := range 3 {
		// Every slot of a's comes back at once: a comes back for them as
		// fast as b does, and may take only its fair share while b waits.
		a.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
		b.pub.Release(-1, relay.Result{Outcome: relay.Confirmed})
		testkit.WaitFor(t, waitTimeout, fmt.Sprintf("round %d: a and b have W/2 = %d in flight each", round, budgetW/2), func() bool {
			return held(a) == budgetW/2 && held(b) == budgetW/2
		})
		if st := budget.Stats(); st.InFlight > budgetW {
			t.Fatalf("round %d: the budget counts %d in flight, W = %d", round, st.InFlight, budgetW)
		}
	}
	drainAll(cores)
	if most := n.Most(); most > budgetW {
		t.Fatalf("the node had %d unconfirmed at once, W = %d", most, budgetW)
	}
	if st := budget.Stats(); st.InFlight != 0 || st.BytesUsed != 0 {
		t.Fatalf("drained, the budget still counts %d in flight and %d bytes", st.InFlight, st.BytesUsed)
	}
}
