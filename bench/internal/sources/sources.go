package sources

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/produce"
	"github.com/ordo-relay/ordo/bench/internal/shapes"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// The sources scenario measures what a second outbox database
// buys: the same producers and the same node(s) against one source, then
// against two, each source on a PostgreSQL cluster of the scenario's own
// capped to -sources-cap of a core (sources_pg.go makes the clusters,
// cgroup.go caps them). Per run: a backlog drained by the nodes (msg/s,
// per source and in total), then closed-loop producers with the nodes
// relaying (insert tps), each source checked for loss and per-key order.
// One source against two is alternated -sources-reps times; the summary
// gives the medians and the ratios two ÷ one.

// sourcesFlags are the sources scenario's flags.
type sourcesFlags struct {
	Counts    []int         // source counts, alternated within each repetition
	Cap       float64       // CPU cap of each PostgreSQL cluster, in cores
	Period    time.Duration // CFS period of the caps
	Rows      int           // backlog rows, all sources together
	Keys      int           // keys, all sources together
	Producers int           // producer connections, all sources together
	Duration  time.Duration // measured producer window
	Warmup    time.Duration // producers run this long before the window
	Reps      int           // repetitions of every count
	Nodes     int           // Ordo nodes relaying every source
	NodeCap   float64       // CPU cap per node in cores; 0 leaves them uncapped
	PGVersion string        // PostgreSQL major version of the clusters
	// Partitions are the sources' partition counts, s1's first; empty:
	// every source has -partitions.
	Partitions []int
	// Budget are the budget modes of the runs of several sources,
	// alternated within each repetition: BudgetShared (the node's relays
	// share one relay.Budget) and BudgetUnshared (each has the node's
	// full W and read-ahead: the node's bench hook).
	Budget []string
	// Trickle, when above 0, is the commits a second into the last source
	// while the others drain, in place of its backlog (sources_budget.go).
	Trickle int
}

// Options are the sources scenario's: -payload and its -sources-*
// flags.
type Options struct {
	measure.Common
	Payload int          // approximate payload size in bytes
	Sources sourcesFlags // its -sources-* flags
}

func DefaultOptions() Options {
	return Options{Payload: 300, Sources: defaultSourcesFlags()}
}

func (o *Options) AddFlags(fs *flag.FlagSet) {
	measure.PayloadVar(fs, &o.Payload)
	addSourcesFlags(fs, &o.Sources)
}

func (o Options) Validate() error {
	return errors.Join(measure.CheckPayload(o.Payload), o.Sources.Validate())
}

// defaultSourcesFlags returns the sources scenario's defaults.
func defaultSourcesFlags() sourcesFlags {
	return sourcesFlags{Counts: []int{1, 2}, Cap: 0.25, Period: 20 * time.Millisecond, Rows: 10000, Keys: 1000,
		Producers: 4, Duration: 10 * time.Second, Warmup: 2 * time.Second, Reps: 2, Nodes: 1, PGVersion: "15",
		Budget: []string{BudgetShared}}
}

// addSourcesFlags registers the -sources-* flags on fs, with p's values as
// their defaults.
func addSourcesFlags(fs *flag.FlagSet, p *sourcesFlags) {
	measure.ListVar(fs, "sources-counts", measure.JoinInts(p.Counts), "comma-separated source counts (1 or 2), alternated within each repetition", func(s string) (err error) {
		p.Counts, err = produce.ParseRange("sources-counts", s, 1, 2)
		return err
	})
	fs.Float64Var(&p.Cap, "sources-cap", p.Cap, "CPU cap of each PostgreSQL cluster, in cores")
	fs.DurationVar(&p.Period, "sources-period", p.Period, "CFS period of the clusters' caps")
	fs.IntVar(&p.Rows, "sources-rows", p.Rows, "backlog rows, split evenly over the sources")
	fs.IntVar(&p.Keys, "sources-keys", p.Keys, "keys, split evenly over the sources")
	fs.IntVar(&p.Producers, "sources-producers", p.Producers, "producer connections, split evenly over the sources")
	fs.DurationVar(&p.Duration, "sources-duration", p.Duration, "measured producer window per run (0: no producers, the drain only)")
	fs.DurationVar(&p.Warmup, "sources-warmup", p.Warmup, "producers run this long before the window")
	fs.IntVar(&p.Reps, "sources-reps", p.Reps, "repetitions of every source count (alternating); medians are reported")
	fs.IntVar(&p.Nodes, "sources-nodes", p.Nodes, "Ordo nodes, each relaying every source")
	fs.Float64Var(&p.NodeCap, "sources-node-cap", p.NodeCap, "CPU cap per node in cores (0: uncapped)")
	fs.StringVar(&p.PGVersion, "sources-pg-version", p.PGVersion, "PostgreSQL major version of the clusters (pg_createcluster's)")
	addSourcesBudgetFlags(fs, p)
}

func (p sourcesFlags) Validate() error {
	switch {
	case p.Cap <= 0 || p.Cap > 2 || p.NodeCap < 0 || p.NodeCap > 2:
		return errors.New("sources-cap must be in (0, 2] cores and sources-node-cap in [0, 2]")
	case p.Period < time.Millisecond || p.Period > time.Second:
		return errors.New("sources-period must be in [1ms, 1s]")
	case p.Rows < 2 || p.Keys < 2 || p.Keys > p.Rows:
		return errors.New("sources-rows and sources-keys must be at least 2, keys at most rows")
	case p.Producers < 2 || p.Producers > 64:
		return errors.New("sources-producers must be 2..64")
	case p.Duration < 0 || p.Warmup < 0:
		return errors.New("sources-duration and sources-warmup must not be negative")
	case p.Reps < 1 || p.Reps > 20 || p.Nodes < 1 || p.Nodes > 8:
		return errors.New("sources-reps must be 1..20 and sources-nodes 1..8")
	case p.PGVersion == "" || strings.Trim(p.PGVersion, "0123456789") != "":
		return fmt.Errorf("sources-pg-version %q: want a major version such as 15", p.PGVersion)
	}
	return p.validateBudget()
}

// sourceNames are the sources' names: s1, s2.
func sourceNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "s" + strconv.Itoa(i+1)
	}
	return out
}

// srcMaxConns is each cluster's max_connections: the producers, the
// nodes' pools, the bench's own and the samplers', with room.
const srcMaxConns = 150

// Run makes the clusters, runs every source count -sources-reps
// times (alternating), emits one result per run and a summary of medians
// and ratios.
func Run(ctx context.Context, o Options, emit func(*result.Result)) error {
	p := o.Sources
	if err := checkPGTools(os.Geteuid(), exec.LookPath); err != nil {
		return err
	}
	// The node is built now, not inside a run's measured window.
	bin, err := harness.NodeBinary(ctx, o.Harness())
	if err != nil {
		return err
	}
	o.NodeBin = bin
	pcs := newPGClusters(execRunner, p.PGVersion)
	gone, err := pcs.removeLeftovers(ctx)
	if len(gone) > 0 {
		fmt.Printf("dropped clusters left by an earlier run: %s\n", strings.Join(gone, ", "))
	}
	if err != nil {
		return fmt.Errorf("drop leftover clusters: %w", err)
	}
	caps, err := measure.NewCPUCaps(measure.CgroupRoot, p.Cap, p.Period)
	if err != nil {
		return err
	}
	defer closeCaps(caps)
	if err := raiseWeight(caps); err != nil {
		return err
	}
	defer func() {
		if err := pcs.dropAll(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: cleanup: drop clusters: %v\n", err)
		}
	}()
	// The producers and the consumers run in this process: it gets the
	// raised weight too, without a cap, so that on a loaded machine the
	// capped clusters, not the bench, are the bound.
	self, err := measure.NewCPUCaps(measure.CgroupRoot, float64(runtime.NumCPU()), p.Period)
	if err != nil {
		return err
	}
	defer closeCaps(self) // moves this process back to the root group
	if err := raiseWeight(self); err != nil {
		return err
	}
	if err := self.Cap("bench", os.Getpid()); err != nil {
		return err
	}
	fmt.Printf("CPU caps: cgroup v%d, %.3f core per PostgreSQL cluster (quota %v per %v period)\n", caps.Version, p.Cap, caps.Quota(), caps.Period)
	clusters, err := startSourceClusters(ctx, pcs, caps, slices.Max(p.Counts))
	if err != nil {
		return err
	}
	var runs []*result.Result
	var errs []error
	for rep := range p.Reps {
		for _, run := range p.runs() {
			if ctx.Err() != nil {
				return errors.Join(append(errs, ctx.Err())...)
			}
			fmt.Printf("\n=== sources: %s, rep %d\n", run, rep+1)
			res, err := sourcesOnce(ctx, o, clusters[:run.n], run.budget)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: sources: %s, rep %d: %v\n", run, rep+1, err)
				errs = append(errs, fmt.Errorf("%s, rep %d: %w", run, rep+1, err))
				continue
			}
			res.Param("rep", rep+1)
			runs = append(runs, res)
			emit(res)
		}
	}
	if len(runs) > 0 {
		sum := sourcesSummary(p, runs)
		printSourcesTable(os.Stdout, p, sum)
		emit(sum)
	}
	return errors.Join(errs...)
}

func closeCaps(c *measure.CPUCaps) {
	if err := c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: cleanup: %v\n", err)
	}
}

// capsWeight is the CPU weight of the clusters' parent group: cgroup v1
// cpu.shares (a task's is 1024) and v2 cpu.weight (a task's is 100).
var capsWeight = map[int]string{1: "65536", 2: "6400"}

// raiseWeight gives a parent group (the clusters', the nodes', the
// bench's own) the CPU weight of 64 busy tasks. Without it the group, however many clusters it holds, weighs as
// much as one task of the root group: on a machine with a load of 30 both
// clusters together would get 1/31 of it, and two sources could never
// have twice the CPU of one. Their quotas still cap each cluster.
func raiseWeight(c *measure.CPUCaps) error {
	file := map[int]string{1: "cpu.shares", 2: "cpu.weight"}[c.Version]
	if err := os.WriteFile(filepath.Join(c.Parent, file), []byte(capsWeight[c.Version]), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: write %s: %w", c.Parent, file, err)
	}
	return nil
}

// sourceCluster is a started cluster and its CPU cgroup.
type sourceCluster struct {
	*pgCluster
	cgroup string // the cgroup's directory
}

// startSourceClusters makes and starts n clusters, each in a capped cgroup
// of its own.
func startSourceClusters(ctx context.Context, pcs *pgClusters, caps *measure.CPUCaps, n int) ([]sourceCluster, error) {
	var out []sourceCluster
	for i := range n {
		addr, err := harness.FreeAddr()
		if err != nil {
			return nil, err
		}
		_, port, _ := strings.Cut(addr, ":")
		pn, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("free port %q: %w", addr, err)
		}
		c, err := pcs.create(ctx, i+1, pn, srcMaxConns)
		if err != nil {
			return nil, err
		}
		dir, err := caps.Group(c.Name)
		if err != nil {
			return nil, err
		}
		if err := pcs.Start(ctx, c, dir+"/cgroup.procs"); err != nil {
			return nil, err
		}
		fmt.Printf("cluster %s on port %d, postmaster %d in %s\n", c.Name, c.Port, c.Postmaster, dir)
		out = append(out, sourceCluster{pgCluster: c, cgroup: dir})
	}
	return out, nil
}

// sourcesSummary returns the medians of every kind of run (sourcesRun:
// a source count, and with several sources a budget mode), each figure
// suffixed with the run's key, and the ratios: two sources ÷ one, and
// the shared Budget ÷ none.
func sourcesSummary(p sourcesFlags, runs []*result.Result) *result.Result {
	res := result.New("sources")
	res.Label = "summary"
	res.Param("cap_cores", p.Cap)
	res.Param("reps", p.Reps)
	figs := []string{"drain_msgs_per_sec", "insert_tps", "drain_pg_busy", "insert_pg_busy", "drain_machine_busy", "insert_machine_busy",
		"drain_msgs_per_sec_s1", "drain_msgs_per_sec_s2", "drain_max_unconfirmed", "drain_node_us_per_msg", "trickle_p50_ms", "trickle_p99_ms"}
	med := map[string]map[string]float64{}
	for _, run := range p.runs() {
		k := run.key()
		med[k] = map[string]float64{}
		for _, f := range figs {
			var vs []float64
			for _, r := range runs {
				if v, ok := r.Lookup(f); ok && runKeyOf(r) == k {
					vs = append(vs, v)
				}
			}
			if len(vs) == 0 {
				continue
			}
			med[k][f] = produce.Median(vs)
			res.Figure(f+"_"+k, med[k][f], "")
		}
	}
	ratio := func(name, f string, a, b map[string]float64) {
		if x, y := a[f], b[f]; x > 0 && y > 0 {
			res.Figure(name, x/y, "×")
		}
	}
	for _, f := range []string{"drain_msgs_per_sec", "insert_tps"} {
		ratio(strings.TrimSuffix(strings.TrimSuffix(f, "_msgs_per_sec"), "_tps")+"_ratio", f, med["2"], med["1"])
	}
	for _, f := range []string{"drain_msgs_per_sec", "drain_msgs_per_sec_s1", "drain_msgs_per_sec_s2", "drain_node_us_per_msg", "trickle_p50_ms", "trickle_p99_ms"} {
		ratio("budget_"+strings.TrimPrefix(f, "drain_")+"_ratio", f, med["2"], med["2_"+BudgetUnshared])
	}
	for _, r := range runs {
		res.Check = addReports(res.Check, r.Check)
	}
	res.Finished = time.Now()
	return res
}

// runKeyOf is the key of the run r measured (sourcesRun.key).
func runKeyOf(r *result.Result) string {
	n, _ := strconv.Atoi(shapes.ParamOf(r, "sources"))
	return sourcesRun{n: n, budget: cmp.Or(shapes.ParamOf(r, "budget"), BudgetShared)}.key()
}

// printSourcesTable prints the summary's medians and ratios.
func printSourcesTable(w io.Writer, p sourcesFlags, sum *result.Result) {
	get := func(name string) float64 {
		if v, ok := sum.Lookup(name); ok {
			return v
		}
		return math.NaN()
	}
	fmt.Fprintf(w, "\n%-27s %12s %9s %9s %10s %14s %15s %12s %11s %11s\n", "run", "drain msg/s", "s1", "s2", "insert tps",
		"drain pg_busy", "max unconfirmed", "node µs/msg", "trickle p50", "trickle p99")
	for _, run := range p.runs() {
		k := run.key()
		if _, ok := sum.Lookup("drain_msgs_per_sec_" + k); !ok {
			continue
		}
		fmt.Fprintf(w, "%-27s %12.0f %9.0f %9.0f %10.0f %14.2f %15.0f %12.0f %9.0fms %9.0fms\n", run, get("drain_msgs_per_sec_"+k),
			get("drain_msgs_per_sec_s1_"+k), get("drain_msgs_per_sec_s2_"+k), get("insert_tps_"+k), get("drain_pg_busy_"+k),
			get("drain_max_unconfirmed_"+k), get("drain_node_us_per_msg_"+k), get("trickle_p50_ms_"+k), get("trickle_p99_ms_"+k))
	}
	fmt.Fprintf(w, "two ÷ one: drain %.2f×, insert %.2f×\n", get("drain_ratio"), get("insert_ratio"))
	fmt.Fprintf(w, "Budget ÷ none (two sources): drain %.2f× (s1 %.2f×, s2 %.2f×), node µs/msg %.2f×, trickle p50 %.2f×, p99 %.2f×\n",
		get("budget_msgs_per_sec_ratio"), get("budget_msgs_per_sec_s1_ratio"), get("budget_msgs_per_sec_s2_ratio"),
		get("budget_node_us_per_msg_ratio"), get("budget_trickle_p50_ms_ratio"), get("budget_trickle_p99_ms_ratio"))
}
