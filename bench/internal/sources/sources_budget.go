package sources

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/produce"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/partition"
)

// The sources scenario's per-source partition counts and its A/B of the
// relay.Budget: with several sources a node's relays share one
// Budget, its confirm window W and read-ahead bytes (docs/design.md,
// "Sharing W and the read-ahead budget"). -sources-budget shared,unshared
// alternates runs with it and runs where every relay has the node's full
// W and read-ahead, through the node's bench hook (unsharedBudgetEnv),
// which no user sets. -sources-trickle measures what the Budget is for:
// while one source drains a backlog, the other gets a small steady
// trickle, and the trickle's commit-to-delivery latency is reported.

const (
	BudgetShared   = "shared"   // the node's relays share one relay.Budget
	BudgetUnshared = "unshared" // each relay has the node's full W and read-ahead
)

// unsharedBudgetEnv is the node's bench hook (cmd/node's benchhook.go),
// read only by a node built with the ordobench tag, as the bench builds
// it (harness.NodeBuildTag): set to 1, its sources' relays share no
// Budget.
const unsharedBudgetEnv = "ORDO_BENCH_UNSHARED_BUDGET"

// trickleKeys is how many keys the trickle's messages cycle over.
const trickleKeys = 10

// sourcesRun is one kind of run: a source count and, with several
// sources, a budget mode.
type sourcesRun struct {
	n      int
	budget string
}

// runs returns the kinds of run of one repetition, in order: every count
// of -sources-counts, a count of several sources once per budget mode.
func (p sourcesFlags) runs() []sourcesRun {
	var out []sourcesRun
	for _, n := range p.Counts {
		if n == 1 {
			out = append(out, sourcesRun{n: 1, budget: BudgetShared}) // one relay: no Budget either way
			continue
		}
		modes := p.Budget
		if len(modes) == 0 {
			modes = []string{BudgetShared}
		}
		for _, b := range modes {
			out = append(out, sourcesRun{n: n, budget: b})
		}
	}
	return out
}

// key names the run's figures in the summary: "1", "2", "2_unshared".
func (r sourcesRun) key() string {
	if r.budget == BudgetUnshared {
		return strconv.Itoa(r.n) + "_" + BudgetUnshared
	}
	return strconv.Itoa(r.n)
}

func (r sourcesRun) String() string {
	if r.n == 1 {
		return "1 source"
	}
	return fmt.Sprintf("%d sources, %s budget", r.n, r.budget)
}

// addSourcesBudgetFlags registers -sources-partitions, -sources-budget
// and -sources-trickle.
func addSourcesBudgetFlags(fs *flag.FlagSet, p *sourcesFlags) {
	measure.ListVar(fs, "sources-partitions", measure.JoinInts(p.Partitions), "comma-separated partition counts of the sources, s1's first (the node's -source-partitions); empty: every source has -partitions", func(s string) (err error) {
		p.Partitions = nil
		if s != "" {
			p.Partitions, err = produce.ParseRange("sources-partitions", s, 1, partition.MaxCount)
		}
		return err
	})
	measure.ListVar(fs, "sources-budget", strings.Join(p.Budget, ","), "comma-separated budget modes of the runs of 2 sources, alternated: shared (one relay.Budget, as nodes run) and unshared (each relay has the node's full W and read-ahead)", func(s string) error {
		p.Budget = strings.Split(s, ",")
		return nil
	})
	fs.IntVar(&p.Trickle, "sources-trickle", p.Trickle, "commits a second into the last source while the others drain, in place of its backlog (0: none)")
}

func (p sourcesFlags) validateBudget() error {
	var errs []error
	if n := len(p.Partitions); n > 0 && n != slices.Max(p.Counts) {
		errs = append(errs, fmt.Errorf("sources-partitions gives %d count(s): want one per source (%d)", n, slices.Max(p.Counts)))
	}
	for _, b := range p.Budget {
		if b != BudgetShared && b != BudgetUnshared {
			errs = append(errs, fmt.Errorf("sources-budget %q: want %s or %s", b, BudgetShared, BudgetUnshared))
		}
	}
	if len(p.Budget) == 0 || len(p.Budget) > 4 {
		errs = append(errs, errors.New("sources-budget: want 1 to 4 modes"))
	}
	if p.Trickle < 0 || p.Trickle > 1000 {
		errs = append(errs, fmt.Errorf("sources-trickle %d out of range 0..1000", p.Trickle))
	}
	if p.Trickle > 0 && slices.Contains(p.Counts, 1) {
		errs = append(errs, errors.New("sources-trickle needs at least 2 sources in every run: -sources-counts 2"))
	}
	return errors.Join(errs...)
}

// partitionsOf returns source i's partition count (0-based): its
// -sources-partitions, or def (-partitions).
func (p sourcesFlags) partitionsOf(i, def int) int {
	if i < len(p.Partitions) {
		return p.Partitions[i]
	}
	return def
}

// nodeSource is what a node is told of one source.
type nodeSource struct {
	name, url  string
	partitions int
}

// sourcesNodeEnv is the nodes' environment for srcs: ORDO_SOURCES, every
// source's ORDO_SOURCE_PARTITIONS (-source-partitions) where it differs
// from the node's partitions (def), and the bench hook of budget.
func sourcesNodeEnv(srcs []nodeSource, def int, budget string) []string {
	var pairs, counts []string
	for _, s := range srcs {
		pairs = append(pairs, s.name+"="+s.url)
		if s.partitions != def {
			counts = append(counts, s.name+"="+strconv.Itoa(s.partitions))
		}
	}
	env := []string{"ORDO_SOURCES=" + strings.Join(pairs, " ")}
	if len(counts) > 0 {
		env = append(env, "ORDO_SOURCE_PARTITIONS="+strings.Join(counts, " "))
	}
	if budget == BudgetUnshared {
		env = append(env, unsharedBudgetEnv+"=1")
	}
	return env
}

// trickle commits rate rows a second, one per transaction, into a source
// while others drain, and keeps when each committed.
type trickle struct {
	mu        sync.Mutex
	committed map[string]time.Time // by id
	errs      int
}

// Run commits into pool, with w's keys, until ctx ends.
func (t *trickle) Run(ctx context.Context, pool *pgxpool.Pool, rate int, w *produce.Writer) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k, id := i%trickleKeys, uuid.Must(uuid.NewV7())
		_, err := pool.Exec(ctx, produce.SQLOrdo, id, w.Partitions[k], w.Keys[k], w.Exchange, produce.RoutingKey, produce.Type, w.Payload(k))
		at := time.Now()
		t.mu.Lock()
		if err != nil {
			t.errs++
		} else {
			t.committed[id.String()] = at
		}
		t.mu.Unlock()
	}
}

// latencies returns the commit-to-delivery latency of every trickled row
// recv has, sorted, and how many it lacks.
func (t *trickle) latencies(recv map[string]time.Time) (lat []time.Duration, missing int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, c := range t.committed {
		if r, ok := recv[id]; ok {
			lat = append(lat, r.Sub(c))
		} else {
			missing++
		}
	}
	slices.Sort(lat)
	return lat, missing
}

// unconfirmedPeak polls the nodes' ordo_relay_unconfirmed (every source's
// relay together) every 50 ms until ctx ends, and returns the highest
// sum seen: a lower bound of the node's peak, which a poll can miss.
func unconfirmedPeak(ctx context.Context, sys *measure.OrdoSystem) float64 {
	var peak float64
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var sum float64
		for _, nd := range sys.C.Nodes {
			if nd == nil {
				continue
			}
			if v, ok, err := nd.Metric(ctx, "ordo_relay_unconfirmed"); err == nil && ok {
				sum += v
			}
		}
		peak = max(peak, sum)
		select {
		case <-ctx.Done():
			return peak
		case <-tick.C:
		}
	}
}

// drainTarget is the backlog a run's sources hold: rows and keys per
// source, the last source getting none when it trickles instead.
func (p sourcesFlags) drainTarget(n int) (rows, keys []int) {
	backlogged := n
	if p.Trickle > 0 {
		backlogged = n - 1
	}
	rows, keys = make([]int, n), make([]int, n)
	for i := range backlogged {
		rows[i], keys[i] = p.Rows/backlogged, p.Keys/backlogged
	}
	return rows, keys
}

// startTrickle starts the trickle into the last of srcs when -sources-trickle
// asks for one; stop ends it and waits. t is nil without one.
func startTrickle(ctx context.Context, o Options, srcs []*benchSource) (t *trickle, stop func(), err error) {
	if o.Sources.Trickle == 0 {
		return nil, func() {}, nil
	}
	s := srcs[len(srcs)-1]
	w, err := sourceWriter(o, s.rig.Config.Partitions, trickleKeys, s.rig.Exchange)
	if err != nil {
		return nil, nil, err
	}
	t = &trickle{committed: map[string]time.Time{}}
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.Run(tctx, s.rig.Pool, o.Sources.Trickle, w)
	}()
	return t, func() { cancel(); <-done }, nil
}

// waitTrickle waits until the trickle source's consumer has every row
// committed, and adds its latency percentiles.
func waitTrickle(ctx context.Context, o Options, t *trickle, s *benchSource, failed func() error) (p50, p99 time.Duration, n int, err error) {
	t.mu.Lock()
	ids := make([]string, 0, len(t.committed))
	for id := range t.committed {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	if err := s.cons.WaitAll(ctx, ids, o.Timeout, failed); err != nil {
		return 0, 0, 0, fmt.Errorf("source %s: trickle: %w", s.name, err)
	}
	lat, missing := t.latencies(s.cons.ReceiveTimes())
	if len(lat) == 0 || missing > 0 {
		return 0, 0, 0, fmt.Errorf("source %s: trickle: %d delivered, %d missing", s.name, len(lat), missing)
	}
	return result.Percentile(lat, 0.50), result.Percentile(lat, 0.99), len(lat), nil
}
