package sources

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/produce"
	"github.com/ordo-relay/ordo/bench/internal/steady"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// benchSource is one source of a run: its cluster, its database (a rig
// with its own exchange), the consumer of that exchange, and what the run
// wrote into it.
type benchSource struct {
	name    string
	cluster sourceCluster
	rig     *harness.Rig
	cons    *measure.Consumer
	backlog []string // ids of the backlog's rows
	pw      produce.Window
}

// sourcesOnce is one run with one source per cluster: the backlog is
// loaded into every source before the nodes start, the nodes drain it,
// then the producers write into every source while the nodes relay.
func sourcesOnce(ctx context.Context, o Options, clusters []sourceCluster, budget string) (*result.Result, error) {
	p := o.Sources
	n := len(clusters)
	res := result.New("sources")
	res.Label = fmt.Sprintf("sources-%d", n)
	res.Param("sources", n)
	if n > 1 {
		res.Label += "-" + budget
		res.Param("budget", budget)
	}
	res.Param("cap_cores", p.Cap)
	res.Param("period", p.Period)
	res.Param("nodes", p.Nodes)
	if p.NodeCap > 0 {
		res.Param("node_cap_cores", p.NodeCap)
	}
	res.Param("producers", p.Producers)
	rows, keys := p.drainTarget(n)
	res.Param("msgs", sum(rows))
	res.Param("keys", sum(keys))
	if p.Trickle > 0 {
		res.Param("trickle", p.Trickle)
	}
	srcs, closeAll, err := openSources(ctx, o, clusters)
	defer closeAll()
	if err != nil {
		return nil, err
	}
	for i, s := range srcs {
		res.Param("partitions_"+s.name, s.rig.Config.Partitions)
		if rows[i] == 0 {
			continue
		}
		l, err := drain.LoadGroups(ctx, s.rig, []drain.RowGroup{{Prefix: "key", Keys: keys[i], Rows: rows[i]}}, o.Payload, true)
		if err != nil {
			return nil, fmt.Errorf("source %s: %w", s.name, err)
		}
		s.backlog = l.Timed
	}
	nodeRig := &harness.Rig{Config: o.Harness()}
	defer nodeRig.Close() // stops the nodes, before the rigs drop the databases
	sys, err := drainSources(ctx, o, srcs, nodeRig, budget, res)
	if err != nil {
		return nil, err
	}
	if p.Duration > 0 {
		if err := produceSources(ctx, o, srcs, sys, res); err != nil {
			return nil, err
		}
	}
	for _, s := range srcs {
		rep, err := checkSource(ctx, o, s)
		if err != nil {
			return nil, err
		}
		res.Figure("lost_"+s.name, float64(rep.Lost), "")
		res.Figure("reorders_"+s.name, float64(rep.Reorders), "")
		res.Check = addReports(res.Check, rep)
	}
	res.Finished = time.Now()
	return res, nil
}

// openSources creates a database (migrated, with an exchange and a
// consumer) on each cluster. The returned close removes whatever was
// created, also on error.
func openSources(ctx context.Context, o Options, clusters []sourceCluster) ([]*benchSource, func(), error) {
	var srcs []*benchSource
	closeAll := func() {
		for i := len(srcs) - 1; i >= 0; i-- {
			srcs[i].rig.Close()
		}
	}
	names := sourceNames(len(clusters))
	for i, c := range clusters {
		cfg := o.Harness()
		cfg.PostgresURL = c.adminURL()
		cfg.Partitions = o.Sources.partitionsOf(i, o.Partitions) // the source's migration, its rows' partitions
		r, err := harness.New(ctx, cfg, "sources_"+names[i], int32(o.Sources.Producers/len(clusters)+2))
		if err != nil {
			return srcs, closeAll, fmt.Errorf("source %s: %w", names[i], err)
		}
		s := &benchSource{name: names[i], cluster: c, rig: r}
		srcs = append(srcs, s)
		if err := r.DeclareExchange(ctx); err != nil {
			return srcs, closeAll, err
		}
		if s.cons, err = measure.StartRigConsumer(ctx, r, false); err != nil {
			return srcs, closeAll, err
		}
	}
	return srcs, closeAll, nil
}

// nodeSources is what the nodes are told of srcs (sourcesNodeEnv).
func nodeSources(srcs []*benchSource) []nodeSource {
	out := make([]nodeSource, len(srcs))
	for i, s := range srcs {
		out[i] = nodeSource{name: s.name, url: s.rig.DBURL, partitions: s.rig.Config.Partitions}
	}
	return out
}

func sum(ns []int) (t int) {
	for _, n := range ns {
		t += n
	}
	return t
}

// clusterSample is the CPU of every cluster's processes and its throttled
// periods at one moment, with the nodes' CPU and the machine's.
type clusterSample struct {
	procs     []map[int]time.Duration // by source: pid -> CPU
	throttled []int64
	nodes     time.Duration
	machine   measure.CPUSample
}

func sampleSources(srcs []*benchSource, sys *measure.OrdoSystem) (clusterSample, error) {
	cs := clusterSample{machine: measure.SampleCPU()}
	for _, s := range srcs {
		procs, err := groupCPU(s.cluster.cgroup)
		if err != nil {
			return cs, err
		}
		b, err := os.ReadFile(filepath.Join(s.cluster.cgroup, "cpu.stat"))
		if err != nil {
			return cs, fmt.Errorf("cgroup of %s: %w", s.name, err)
		}
		cs.procs = append(cs.procs, procs)
		cs.throttled = append(cs.throttled, measure.ParseCPUStat(string(b))["nr_throttled"])
	}
	if sys != nil {
		cpu, err := measure.UsageNow(sys)
		if err != nil {
			return cs, err
		}
		cs.nodes = cpu
	}
	return cs, nil
}

// groupCPU returns the CPU so far of every process in the cgroup dir.
// A process that exits between two samples loses its CPU since the first
// (the pools' connections live through a run; few do).
func groupCPU(dir string) (map[int]time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	out := map[int]time.Duration{}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if cpu, err := harness.ProcCPU(pid); err == nil {
			out[pid] = cpu
		}
	}
	return out, nil
}

// addSourceCPU adds, for the window from a to b, each cluster's busy share
// of its cap (prefix_pg_busy_<source>, and their mean prefix_pg_busy),
// its throttled periods, the nodes' cores and the machine's figures.
func addSourceCPU(res *result.Result, prefix string, srcs []*benchSource, a, b clusterSample, capCores float64) {
	wall := b.machine.At.Sub(a.machine.At).Seconds()
	var sum float64
	for i, s := range srcs {
		var d time.Duration
		for pid, t := range b.procs[i] {
			d += t - a.procs[i][pid] // a new process counts from 0
		}
		busy := d.Seconds() / wall / capCores
		sum += busy
		res.Figure(prefix+"pg_busy_"+s.name, busy, "")
		res.Figure(prefix+"throttled_"+s.name, float64(b.throttled[i]-a.throttled[i]), "")
	}
	res.Figure(prefix+"pg_busy", sum/float64(len(srcs)), "")
	res.Figure(prefix+"node_cores", (b.nodes-a.nodes).Seconds()/wall, "")
	measure.AddCPU(res, a.machine, b.machine, prefix)
}

// drainSources starts the nodes on every source and waits until each
// source's backlog has arrived. The rate is the backlog's rows over the
// first to the last delivery, per source and of all together. With
// -sources-trickle the last source has no backlog: from the first
// delivery of the others until they have drained, it gets a steady
// trickle, whose commit-to-delivery latency is reported. The nodes'
// unconfirmed messages (every source's) are polled all along.
func drainSources(ctx context.Context, o Options, srcs []*benchSource, nodeRig *harness.Rig, budget string, res *result.Result) (*measure.OrdoSystem, error) {
	a, err := sampleSources(srcs, nil)
	if err != nil {
		return nil, err
	}
	sys, err := startSourceNodes(ctx, o, srcs, nodeRig, budget)
	if err != nil {
		return nil, err
	}
	peak := pollUnconfirmed(ctx, sys)
	defer peak() // on error; idempotent
	drained, stopTrickle := srcs, func() {}
	var tr *trickle
	if o.Sources.Trickle > 0 {
		drained = srcs[:len(srcs)-1]
		if err := drained[0].cons.WaitDistinct(ctx, 1, o.Timeout, sys.Failed); err != nil {
			return nil, fmt.Errorf("source %s: drain: %w", drained[0].name, err)
		}
		if tr, stopTrickle, err = startTrickle(ctx, o, srcs); err != nil {
			return nil, err
		}
		defer stopTrickle() // on error; idempotent
	}
	total, first, last, err := waitDrained(ctx, o, drained, sys, res)
	stopTrickle()
	if err != nil {
		return nil, err
	}
	res.Figure("drain_max_unconfirmed", peak(), "")
	if tr != nil {
		if err := trickleFigures(ctx, o, tr, srcs[len(srcs)-1], sys, res); err != nil {
			return nil, err
		}
	}
	b, err := sampleSources(srcs, sys)
	if err != nil {
		return nil, err
	}
	b.nodes -= a.nodes // the nodes started after a: all their CPU counts
	res.Figure("drain_msgs_per_sec", float64(total)/last.Sub(first).Seconds(), "msg/s")
	res.Seconds("drain_seconds", last.Sub(first))
	res.Figure("drain_node_us_per_msg", b.nodes.Seconds()*1e6/float64(total), "µs") // their start's CPU included
	addSourceCPU(res, "drain_", srcs, a, b, o.Sources.Cap)
	fmt.Printf("drained %d rows from %d source(s) in %v\n", total, len(drained), last.Sub(first).Round(time.Millisecond))
	return sys, nil
}

// pollUnconfirmed polls the nodes' unconfirmed messages (unconfirmedPeak)
// until the returned func is called, which returns the peak; it may be
// called again.
func pollUnconfirmed(ctx context.Context, sys *measure.OrdoSystem) func() float64 {
	pctx, stop := context.WithCancel(ctx)
	peak := make(chan float64, 1)
	go func() { peak <- unconfirmedPeak(pctx, sys) }()
	return sync.OnceValue(func() float64 { stop(); return <-peak })
}

// trickleFigures waits for the trickle's last rows and adds its latency.
func trickleFigures(ctx context.Context, o Options, tr *trickle, s *benchSource, sys *measure.OrdoSystem, res *result.Result) error {
	p50, p99, n, err := waitTrickle(ctx, o, tr, s, sys.Failed)
	if err != nil {
		return err
	}
	res.Figure("trickle_p50_ms", float64(p50)/float64(time.Millisecond), "ms")
	res.Figure("trickle_p99_ms", float64(p99)/float64(time.Millisecond), "ms")
	res.Figure("trickle_msgs", float64(n), "")
	fmt.Printf("trickle into %s: %d messages, commit to delivery p50 %v, p99 %v\n", s.name, n, p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	return nil
}

// waitDrained waits until each of srcs has its backlog delivered, and
// adds each one's rate.
func waitDrained(ctx context.Context, o Options, srcs []*benchSource, sys *measure.OrdoSystem, res *result.Result) (total int, first, last time.Time, err error) {
	for _, s := range srcs {
		if err := s.cons.WaitDistinct(ctx, len(s.backlog), o.Timeout, sys.Failed); err != nil {
			return 0, first, last, fmt.Errorf("source %s: drain: %w", s.name, err)
		}
		f, l, got := drain.DeliverySpan(s.backlog, s.cons.ReceiveTimes())
		total += got
		res.Figure("drain_msgs_per_sec_"+s.name, float64(got)/l.Sub(f).Seconds(), "msg/s")
		if first.IsZero() || f.Before(first) {
			first = f
		}
		last = steady.MaxTime(last, l)
	}
	return total, first, last, nil
}

// startSourceNodes starts -sources-nodes nodes relaying every source,
// each in a cgroup of the raised weight (raiseWeight), capped when
// -sources-node-cap is set. They stop at nodeRig's close.
func startSourceNodes(ctx context.Context, o Options, srcs []*benchSource, nodeRig *harness.Rig, budget string) (*measure.OrdoSystem, error) {
	p := o.Sources
	c, err := harness.NewCluster(nodeRig, o.AMQPURL, p.Nodes, p.Nodes > 1)
	if err != nil {
		return nil, err
	}
	c.Env = sourcesNodeEnv(nodeSources(srcs), o.Partitions, budget)
	// Uncapped nodes get a quota of every core, which caps nothing, and
	// the weight, as capped ones do.
	caps, err := measure.NewCPUCaps(measure.CgroupRoot, cmp.Or(p.NodeCap, float64(runtime.NumCPU())), p.Period)
	if err != nil {
		return nil, err
	}
	nodeRig.OnClose("remove the nodes' cgroups", func(context.Context) error { return caps.Close() })
	if err := raiseWeight(caps); err != nil {
		return nil, err
	}
	c.OnStart = func(_ int, nd *harness.Node) error { return caps.Cap(nd.Name, nd.Pid()) }
	for i := range p.Nodes {
		nd, err := c.Start(ctx, i)
		if err != nil {
			return nil, err
		}
		if budget == BudgetUnshared {
			// Only a node built with the ordobench tag reads the switch,
			// and it says so; a -node-bin built without it would run the
			// shared side under the unshared name.
			if err := nd.Proc.AwaitOutput("bench hook:", 30*time.Second); err != nil {
				return nil, fmt.Errorf("node %s ignores %s (build it with -tags %s): %w", nd.Name, unsharedBudgetEnv, harness.NodeBuildTag, err)
			}
		}
	}
	return &measure.OrdoSystem{C: c}, nil
}

// produceSources runs -sources-producers closed-loop producers, split
// evenly over the sources (one row per transaction, the plain INSERT of
// the produce scenario's ordo-sql), while the nodes relay, and measures
// the commits in the window after the warm-up.
func produceSources(ctx context.Context, o Options, srcs []*benchSource, sys *measure.OrdoSystem, res *result.Result) error {
	p := o.Sources
	v := produce.FindVariant(produce.VariantOrdoSQL)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	per := p.Producers / len(srcs)
	for _, s := range srcs {
		w, err := sourceWriter(o, s.rig.Config.Partitions, p.Keys/len(srcs), s.rig.Exchange)
		if err != nil {
			return err
		}
		for i := range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				produce.Work(wctx, v, w, s.rig.Pool, &s.pw, 1, uint64(i), 0, per) // closed loop: no rate
			}()
		}
	}
	if err := harness.Sleep(ctx, p.Warmup); err != nil {
		return err
	}
	a, err := sampleSources(srcs, sys)
	if err != nil {
		return err
	}
	for _, s := range srcs {
		s.pw.Measuring.Store(true)
	}
	werr := harness.Sleep(ctx, p.Duration)
	for _, s := range srcs {
		s.pw.Measuring.Store(false)
	}
	b, err := sampleSources(srcs, sys)
	stop()
	wg.Wait()
	if werr != nil || err != nil {
		return fmt.Errorf("producers: %w", firstErr(werr, err))
	}
	window := b.machine.At.Sub(a.machine.At).Seconds()
	total, errs := 0, 0
	for _, s := range srcs {
		s.pw.Mu.Lock()
		total += s.pw.Commits
		errs += s.pw.Errors
		res.Figure("insert_tps_"+s.name, float64(s.pw.Commits)/window, "tps")
		s.pw.Mu.Unlock()
	}
	res.Figure("insert_tps", float64(total)/window, "tps")
	res.Figure("insert_errors", float64(errs), "")
	addSourceCPU(res, "insert_", srcs, a, b, p.Cap)
	fmt.Printf("producers: %.0f tps over %d source(s), %d errors\n", float64(total)/window, len(srcs), errs)
	return nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sourceWriter is a produce writer of keys keys to exchange, in a
// source of partitions partitions.
func sourceWriter(o Options, partitions, keys int, exchange string) (*produce.Writer, error) {
	w, err := produce.NewWriter(partitions, keys, o.Payload)
	if err != nil {
		return nil, err
	}
	w.Exchange = exchange
	return w, nil
}

// checkSource waits until the source's consumer has every row the source's
// outbox holds (the backlog's and the producers') and returns the checker's
// report over them: lost, reordered or skipped per (source, key), since
// every source has an exchange, a queue and a checker of its own.
func checkSource(ctx context.Context, o Options, s *benchSource) (result.Check, error) {
	rows, err := s.rig.Pool.Query(ctx, `SELECT id::text FROM outbox ORDER BY seq`)
	if err != nil {
		return result.Check{}, fmt.Errorf("source %s: list rows: %w", s.name, err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return result.Check{}, fmt.Errorf("source %s: list rows: %w", s.name, err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return result.Check{}, fmt.Errorf("source %s: list rows: %w", s.name, err)
	}
	if err := s.cons.WaitAll(ctx, ids, o.Timeout, nil); err != nil {
		fmt.Fprintf(os.Stderr, "bench: sources: source %s: %v\n", s.name, err)
	}
	return s.cons.Report(ids), nil
}

// addReports sums two checker reports (their first problems concatenated).
func addReports(a, b result.Check) result.Check {
	a.Total += b.Total
	a.Distinct += b.Distinct
	a.Duplicates += b.Duplicates
	a.Redeliveries += b.Redeliveries
	a.Lost += b.Lost
	a.Reorders += b.Reorders
	a.Gaps += b.Gaps
	a.Keys += b.Keys
	a.LostIDs = append(a.LostIDs, b.LostIDs...)
	a.Problems = append(a.Problems, b.Problems...)
	return a
}
