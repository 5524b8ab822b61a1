package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/nodetest"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/wire"
)

// confirmGate holds the confirms of a node's publisher while closed, and
// counts the messages published and not yet settled over all its
// sources, and the most there ever were.
type confirmGate struct {
	mu        sync.Mutex
	closed    bool
	held      []func()
	now, most int
}

func (g *confirmGate) count() (now, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now, g.most
}

// open settles every held confirm and lets the later ones through.
func (g *confirmGate) open() {
	g.mu.Lock()
	held := g.held
	g.closed, g.held = false, nil
	g.now -= len(held)
	g.mu.Unlock()
	for _, settle := range held {
		settle()
	}
}

// gated is the node's publisher behind a confirmGate.
type gated struct {
	relay.Publisher
	g *confirmGate
}

func (p gated) Publish(ctx context.Context, m *relay.Message, settle func(relay.Result)) error {
	g := p.g
	g.mu.Lock()
	g.now++
	g.most = max(g.most, g.now)
	g.mu.Unlock()
	err := p.Publisher.Publish(ctx, m, func(res relay.Result) {
		g.mu.Lock()
		if g.closed {
			g.held = append(g.held, func() { settle(res) })
			g.mu.Unlock()
			return
		}
		g.now--
		g.mu.Unlock()
		settle(res)
	})
	if err != nil {
		g.mu.Lock()
		g.now--
		g.mu.Unlock()
	}
	return err
}

// TestUnsharedBudgetHook: a node of two sources, each with more keys
// ready than the confirm window W, has at most W messages unconfirmed
// over both (they share a relay.Budget), and 2 × W with the bench's hook
// nodehook.Hooks.UnsharedBudget (each relay has all of W). Confirms are
// held until both relays hold rows they could publish, so that what is
// unconfirmed stands still and is counted.
// budgetMetrics checks a node's Budget metrics while its W is taken (its
// confirms held): every slot used, split over its sources as their
// relays count them, and the bytes used are the sources' bytes.
func budgetMetrics(t *testing.T, addr string, window int, parts *nodehook.Parts) {
	t.Helper()
	var slots, sourceSlots, bytes, sourceBytes float64
	var relayBytes int64
	ok := false
	for deadline := time.Now().Add(10 * time.Second); !ok && time.Now().Before(deadline); {
		fams := scrapeMetrics(t, addr)
		slots, _ = metricSum(fams, "ordo_budget_slots_used")
		sourceSlots, _ = metricSum(fams, "ordo_budget_source_slots_used")
		bytes, _ = metricSum(fams, "ordo_budget_bytes_used")
		sourceBytes, _ = metricSum(fams, "ordo_budget_source_bytes_used")
		limit, _ := metricSum(fams, "ordo_budget_slots")
		relayBytes = 0
		for _, s := range parts.Sources {
			relayBytes += s.Relay.Stats().ReadAheadBytes
		}
		ok = limit == float64(window) && slots == float64(window) && sourceSlots == slots &&
			bytes > 0 && sourceBytes == bytes && float64(relayBytes) == bytes
		if !ok {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !ok {
		t.Fatalf("budget metrics: %v slots used (sources %v, W %d); %v bytes used (sources %v, relays %d)",
			slots, sourceSlots, window, bytes, sourceBytes, relayBytes)
	}
}

func TestUnsharedBudgetHook(t *testing.T) {
	testkit.RequireRabbitMQ(t)
	const partitions, window, keys = 4, 8, 64
	for _, c := range []struct {
		name     string
		unshared bool
		most     int
	}{{"shared", false, window}, {"unshared", true, 2 * window}} {
		t.Run(c.name, func(t *testing.T) {
			r := newSourceRig(t, partitions)
			for _, name := range []string{wire.DefaultSource, "billing"} {
				msgs := make([]outbox.Message, keys)
				for i := range msgs {
					msgs[i] = outbox.Message{CorrelationID: fmt.Sprintf("k%d", i), Exchange: r.exchanges[name],
						RoutingKey: "m", Type: "t", Payload: json.RawMessage(`{}`)}
				}
				r.dbs[name].Enqueue(t, r.checkers[name], msgs...)
			}
			g := &confirmGate{closed: true}
			var parts atomic.Pointer[nodehook.Parts]
			hooks := nodehook.Hooks{
				UnsharedBudget: c.unshared,
				WrapPublisher:  func(p relay.Publisher) relay.Publisher { return gated{p, g} },
				Built:          func(p nodehook.Parts) { parts.Store(&p) },
			}
			cfg := twoSources(r, r.dbs["billing"].URL, "budgethook-"+c.name, partitions)
			cfg.Relay.Window = window
			addr, stop := nodetest.Run(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn)}, hooks)
			defer stop()
			testkit.WaitFor(t, 30*time.Second, fmt.Sprintf("%d unconfirmed", c.most), func() bool { now, _ := g.count(); return now == c.most })
			if !c.unshared {
				budgetMetrics(t, addr, window, parts.Load())
			}
			testkit.WaitFor(t, 30*time.Second, "both relays hold rows they may not publish", func() bool {
				for _, s := range parts.Load().Sources {
					if s.Relay.Stats().ReadAhead == 0 {
						return false
					}
				}
				return true
			})
			g.open()
			for name, ck := range r.checkers {
				if rep := ck.WaitFor(t, 60*time.Second, func(rep testkit.Report) bool { return rep.Lost == 0 }); !rep.OK() {
					t.Fatalf("%s: %s", name, rep.Detail())
				}
			}
			if _, most := g.count(); most != c.most {
				t.Fatalf("the node had at most %d unconfirmed at once, want %d (W = %d)", most, c.most, window)
			}
		})
	}
}
