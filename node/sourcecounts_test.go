package node_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/internal/nodehook"
	"github.com/ordo-relay/ordo/internal/nodetest"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/wire"
)

// countsRig is two outbox databases installed with different partition
// counts, default with 8 and billing with 16, each published to an
// exchange of its own with a checker on it (per (source, key) order).
type countsRig struct{ *sourceRig }

var countsSources = []string{wire.DefaultSource, "billing"}

func newCountsRig(t *testing.T) *countsRig {
	return &countsRig{newSourceRigCounts(t, map[string]int{wire.DefaultSource: 8, "billing": 16})}
}

// config returns the config of a node named name relaying both
// databases: default with the node's Partitions (8), billing with a
// count of its own (16).
func (r *countsRig) config(name string) node.Config {
	cfg := node.DefaultConfig()
	cfg.Sources = []node.Source{
		{Name: wire.DefaultSource, PostgresURL: r.dbs[wire.DefaultSource].URL},
		{Name: "billing", PostgresURL: r.dbs["billing"].URL, Partitions: r.counts["billing"]},
	}
	cfg.AMQP.URL, cfg.NodeName, cfg.HTTPAddr, cfg.DBMaxConns = testkit.AMQPURL(), name, "127.0.0.1:0", 3
	cfg.Partitions = r.counts[wire.DefaultSource]
	cfg.Relay.PollInterval = 200 * time.Millisecond
	cfg.Relay.RetryMin, cfg.Relay.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	return cfg
}

// the node's count (8) for billing would never read.
func (r *countsRig) backlog(t *testing.T, keys, n int) {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	for i := range n {
		for _, s := range countsSources {
			if err := r.enqueue(ctx, s, fmt.Sprintf("k%d", i%keys)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var above int
	if err := r.dbs["billing"].Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE partition >= 8`).Scan(&above); err != nil {
		t.Fatal(err)
	}
	if above == 0 {
		t.Fatal("no billing row in partitions 8..15: the test would not tell the counts apart")
	}
}

// check waits until each checker has every message, and fails t on a
// loss, a duplicate first delivery out of order, or a key out of order.
func (r *countsRig) check(t *testing.T) {
	t.Helper()
	for _, s := range countsSources {
		rep := r.checkers[s].WaitFor(t, 60*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
		t.Logf("source %s (%d partitions): %s", s, r.counts[s], rep)
		if !rep.OK() {
			t.Fatalf("source %s: %s", s, rep.Detail())
		}
	}
}

// TestSourcesOwnCountsAlone: one node without gossip relays two sources
// installed with 8 and 16 partitions: it holds every partition of each
// (8 and 16), /status and the metrics say each source's count, and a
// backlog in both is delivered, per key in order, nothing lost.
func TestSourcesOwnCountsAlone(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	r := newCountsRig(t)
	r.backlog(t, 40, 200)
	addr, stop := runNode(t, r.config("alone"), node.Options{Logger: testkit.Logger(t, slog.LevelWarn)})
	defer stop()
	testkit.WaitFor(t, 30*time.Second, "every partition of each source held", func() bool {
		st := sourceStatus(addr)
		return len(st[wire.DefaultSource].Held) == 8 && len(st["billing"].Held) == 16
	})
	st := nodeStatus(t, addr)
	if st.Partitions != 8 {
		t.Errorf("/status partitionCount %d, want the first source's 8", st.Partitions)
	}
	for _, s := range st.Sources {
		if s.Partitions != r.counts[s.Name] || len(s.Assignment) != r.counts[s.Name] {
			t.Errorf("/status source %s: partitionCount %d, assignment of %d, want %d", s.Name, s.Partitions, len(s.Assignment), r.counts[s.Name])
		}
	}
	got := map[string]float64{}
	if f := scrapeMetrics(t, addr)["ordo_partitions"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	if got["default"] != 8 || got["billing"] != 16 || len(got) != 2 {
		t.Errorf("ordo_partitions by source %v, want default 8, billing 16", got)
	}
	r.check(t)
}

// TestSourcesOwnCountsTwoNodes: two nodes relay two sources installed
// with 8 and 16 partitions, under load on both and with every key's first
// message failing once (a nack or a return, headFails): each node holds
// half of each source (4 and 8), and after one node stops the other holds
// all of both. Per (source, key) order holds and nothing is lost.
func TestSourcesOwnCountsTwoNodes(t *testing.T) {
	testkit.RequireRabbitMQ(t)
	r := newCountsRig(t)
	gossip := []string{testkit.FreeAddr(t), testkit.FreeAddr(t)}
	addrs, stops, faults := make([]string, 2), make([]func(), 2), make([]*headFails, 2)
	for i := range 2 {
		name := fmt.Sprintf("c%d", i+1)
		cfg := r.config(name)
		cfg.Gossip.BindAddr, cfg.Gossip.Join, cfg.Gossip.RejoinInterval = gossip[i], gossip, time.Second
		cfg.Gossip.Insecure = true
		cfg.LeaseTTL = 5 * time.Second // the shared machine is loaded: no flapping
		faults[i] = &headFails{}
		t.Cleanup(faults[i].nacks.Wait) // after the node has stopped (cleanups run last first)
		addrs[i], stops[i] = nodetest.Run(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn).With("node", name)},
			nodehook.Hooks{WrapPublisher: faults[i].wrap})
	}
	testkit.WaitFor(t, 60*time.Second, "each node holds half of each source", func() bool {
		for i := range 2 {
			st := sourceStatus(addrs[i])
			if len(st[wire.DefaultSource].Held) != 4 || len(st["billing"].Held) != 8 {
				return false
			}
		}
		return true
	})
	for i := range 2 {
		for name, s := range sourceStatus(addrs[i]) {
			if s.Partitions != r.counts[name] || len(s.Assignment) != r.counts[name] {
				t.Errorf("node %d, source %s: partitionCount %d, assignment of %d, want %d", i+1, name, s.Partitions, len(s.Assignment), r.counts[name])
			}
		}
	}

	loadCtx, stopLoad := context.WithCancel(context.Background())
	produced := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; loadCtx.Err() == nil; i++ {
			for _, s := range countsSources {
				if r.enqueue(loadCtx, s, fmt.Sprintf("k%d", i%40)) == nil {
					produced[s]++
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() { stopLoad(); <-done }()
	testkit.WaitFor(t, 30*time.Second, "load under way", func() bool {
		return r.checkers["billing"].Report().Distinct >= 100
	})
	stops[1]()
	testkit.WaitFor(t, 60*time.Second, "c1 holds every partition of both sources", func() bool {
		st := sourceStatus(addrs[0])
		return len(st[wire.DefaultSource].Held) == 8 && len(st["billing"].Held) == 16
	})
	testkit.WaitFor(t, 30*time.Second, "c1 publishes after the handover", func() bool {
		return r.checkers["billing"].Report().Distinct >= 300
	})
	stopLoad()
	<-done
	t.Logf("produced %v", produced)
	r.check(t)
	for i, f := range faults {
		nacked, returned := f.faults()
		t.Logf("node c%d: %d nacks and %d returns injected", i+1, nacked, returned)
	}
	if n, ret := faults[0].faults(); n+ret == 0 {
		t.Fatal("no fault injected: the order check proved nothing")
	}
}

// TestSourceCountMismatchRefused: a node configured with another count
// for a source than its database was installed with refuses to start,
// with an error that names the source and the count to set: billing
// given 8 where 16 is installed, and default left at the node's count
// (16) where 8 is installed.
func TestSourceCountMismatchRefused(t *testing.T) {
	t.Parallel()
	r := newCountsRig(t)
	for _, c := range []struct {
		name string
		edit func(*node.Config)
		want string
	}{
		{"own count", func(c *node.Config) { c.Sources[1].Partitions = 8 },
			"source billing: outbox was installed with 16 partitions but this node is configured with 8 for this source; " +
				"the partition count cannot change after install (set Sources[billing].Partitions: node -source-partitions billing=16, ORDO_SOURCE_PARTITIONS)"},
		{"node's count", func(c *node.Config) { c.Partitions = 16 },
			"source default: outbox was installed with 8 partitions but this node is configured with 16 for this source; " +
				"the partition count cannot change after install (set Sources[default].Partitions: node -source-partitions default=8, ORDO_SOURCE_PARTITIONS)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := r.config("mismatch")
			c.edit(&cfg)
			err := node.Run(testkit.Context(t, 60*time.Second), cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn)})
			if !errors.Is(err, outbox.ErrPartitionMismatch) || err.Error() != c.want {
				t.Fatalf("Run: %v\nwant %s", err, c.want)
			}
		})
	}
}

// TestConfigValidateSourcePartitions: a source's own count is 0 (the
// node's Partitions) or 1..4096; another is reported at Sources, with
// every other problem.
func TestConfigValidateSourcePartitions(t *testing.T) {
	c := node.DefaultConfig()
	c.Sources = []node.Source{{Name: "a", PostgresURL: "postgres://h/a"}, {Name: "b", PostgresURL: "postgres://h/b", Partitions: 4096}}
	if err := c.Validate(); err != nil {
		t.Fatalf("counts 0 and 4096 refused: %v", err)
	}
	c.Sources = []node.Source{{Name: "a", PostgresURL: "postgres://h/a", Partitions: -1},
		{Name: "b", PostgresURL: "postgres://h/b", Partitions: 4097}}
	c.DBMaxConns = 1
	err := c.Validate()
	for _, want := range []string{`source "a": partition count out of range: -1`, `source "b": partition count out of range: 4097`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not say %q: %v", want, err)
		}
	}
	if got := confcheck.Fields(err); !slices.Equal(got, []string{"Sources", "Sources", "DBMaxConns"}) {
		t.Errorf("fields %v, want Sources twice and DBMaxConns", got)
	}
}
