package shapes

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/partition"
)

// hotKeys is the key count of the scaleout's hot-key shape.
const hotKeys = 10

// parseScaleShapes checks a -scale-shapes list.
func parseScaleShapes(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f != "many" && f != "hot" {
			return nil, fmt.Errorf("-scale-shapes: unknown shape %q (many, hot)", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// scaleGroups returns the backlog of a scaleout shape: many keys (rows
// over rows/10 keys) or hot (rows over 10 keys).
func scaleGroups(o scaleoutOptions, shape string) []drain.RowGroup {
	if shape == "hot" {
		return []drain.RowGroup{{Prefix: "key", Keys: hotKeys, Rows: o.ScaleHot}}
	}
	keys := o.ScaleKeys
	if keys == 0 {
		keys = max(1, o.ScaleRows/10)
	}
	return []drain.RowGroup{{Prefix: "key", Keys: keys, Rows: o.ScaleRows}}
}

// scaleoutOptions are scaleout's: capped Ordo nodes draining a backlog.
type scaleoutOptions struct {
	measure.Common
	Payload     int           // approximate payload size in bytes
	ScaleNodes  []int         // node counts
	ScaleCap    float64       // CPU cap per node, in cores
	ScalePeriod time.Duration // CFS period
	ScaleShape  []string      // many, hot
	ScaleRows   int           // rows of the many-keys backlog
	ScaleKeys   int           // keys of the many-keys backlog; 0: ScaleRows/10
	ScaleHot    int           // rows of the hot-key (10 keys) backlog
}

func DefaultScaleoutOptions() scaleoutOptions {
	return scaleoutOptions{Payload: 300, ScaleNodes: []int{1, 2, 3, 4}, ScaleCap: 0.05, ScalePeriod: 10 * time.Millisecond,
		ScaleShape: []string{"many", "hot"}, ScaleRows: 40000, ScaleHot: 5000}
}

func (o *scaleoutOptions) AddFlags(fs *flag.FlagSet) {
	measure.PayloadVar(fs, &o.Payload)
	measure.CountsVar(fs, "scale-nodes", &o.ScaleNodes, "comma-separated node counts")
	fs.Float64Var(&o.ScaleCap, "scale-cap", o.ScaleCap, "CPU cap per node, in cores")
	fs.DurationVar(&o.ScalePeriod, "scale-period", o.ScalePeriod, "CFS period of the caps (raised to fit the kernel's 1 ms minimum quota: 20ms for 0.05 core)")
	measure.ListVar(fs, "scale-shapes", strings.Join(o.ScaleShape, ","), "many (many keys) and/or hot (10 keys)", func(s string) (err error) {
		o.ScaleShape, err = parseScaleShapes(s)
		return err
	})
	fs.IntVar(&o.ScaleRows, "scale-rows", o.ScaleRows, "rows of the many-keys backlog (over -scale-keys keys)")
	fs.IntVar(&o.ScaleKeys, "scale-keys", o.ScaleKeys, "keys of the many-keys backlog (0: rows/10)")
	fs.IntVar(&o.ScaleHot, "scale-hot-rows", o.ScaleHot, "rows of the hot-key backlog (over 10 keys)")
}

func (o scaleoutOptions) Validate() error {
	var errs []error
	if o.ScaleCap <= 0 || o.ScaleCap > 2 || o.ScalePeriod < time.Millisecond || o.ScalePeriod > time.Second {
		errs = append(errs, errors.New("scale-cap must be in (0, 2] cores and scale-period in [1ms, 1s]"))
	}
	if o.ScaleRows < 10 || o.ScaleHot < 10 {
		errs = append(errs, errors.New("scale-rows and scale-hot-rows must be at least 10"))
	}
	if o.ScaleKeys < 0 || o.ScaleKeys > o.ScaleRows {
		errs = append(errs, errors.New("scale-keys must be in [0, scale-rows]"))
	}
	return errors.Join(append(errs, measure.CheckPayload(o.Payload))...)
}

// RunScaleout drains the same backlog with each count of -scale-nodes
// gossiping Ordo nodes, every node in a CPU cgroup of its own capped at
// -scale-cap of a core (period -scale-period), so N nodes have N times
// the CPU of one while PostgreSQL and RabbitMQ keep spare capacity. It
// runs once per -scale-shapes shape (many keys, then 10 hot keys) and
// prints one RESULT line per shape and node count. It refuses to run
// where no CPU cgroup is writable.
func RunScaleout(ctx context.Context, o scaleoutOptions, emit func(*result.Result)) error {
	probe, err := measure.NewCPUCaps(measure.CgroupRoot, o.ScaleCap, o.ScalePeriod)
	if err != nil {
		return err
	}
	fmt.Printf("CPU caps: cgroup v%d, %.3f core per node (quota %v per %v period)\n", probe.Version, o.ScaleCap, probe.Quota(), probe.Period)
	if err := probe.Close(); err != nil {
		return err
	}
	var errs []error
	for _, shape := range o.ScaleShape {
		one := 0.0
		for _, n := range o.ScaleNodes {
			if ctx.Err() != nil {
				return errors.Join(append(errs, ctx.Err())...)
			}
			fmt.Printf("\n=== scaleout: %s keys, %d capped node(s)\n", shape, n)
			res, err := scaleoutOnce(ctx, o, shape, n, one)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: scaleout %s %d: %v\n", shape, n, err)
				errs = append(errs, fmt.Errorf("%s, %d nodes: %w", shape, n, err))
				continue
			}
			if n == 1 {
				one, _ = res.Lookup("msgs_per_sec")
			}
			emit(res)
		}
	}
	return errors.Join(errs...)
}

// scaleoutOnce is one drain with n capped nodes. one is the one-node
// msgs/s of the same shape in this run (0 when not measured), for the
// efficiency.
func scaleoutOnce(ctx context.Context, o scaleoutOptions, shape string, n int, one float64) (*result.Result, error) {
	caps, err := measure.NewCPUCaps(measure.CgroupRoot, o.ScaleCap, o.ScalePeriod)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := caps.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: cleanup: %v\n", err)
		}
	}()
	spec := measure.SystemSpec{N: n, OnStart: func(slot int, nd *harness.Node) error { return caps.Cap(nd.Name, nd.Pid()) }}
	var throttled0 int64
	var committed time.Time
	var spread float64
	var rebalances int
	plan := drain.Plan{
		Scenario: "scaleout", Label: fmt.Sprintf("%s-%d", shape, n), Groups: scaleGroups(o, shape), Payload: o.Payload, Analyze: true,
		Before: func(ctx context.Context, r *harness.Rig, sys measure.System, _ *result.Result) error {
			committed = time.Now()
			if throttled0, err = caps.Throttled(); err != nil {
				return err
			}
			spread, err = keySpreadLimit(ctx, sys, o.Partitions, shape)
			return err
		},
		After: func(ctx context.Context, r *harness.Rig, _ measure.System, _ *result.Result) error {
			rebalances, err = claimsSince(ctx, r, committed)
			return err
		},
	}
	d, _, err := drain.Backlog(ctx, o.Common, spec, plan)
	if err != nil {
		return nil, err
	}
	throttled1, err := caps.Throttled()
	if err != nil {
		return nil, err
	}
	res := result.New("scaleout")
	res.Started = d.Started
	res.Param("shape", shape)
	res.Param("nodes", n)
	res.Param("cap_cores", o.ScaleCap)
	res.Param("period", caps.Period)
	res.Param("cgroup", fmt.Sprintf("v%d", caps.Version))
	res.Param("msgs", ParamOf(d, "msgs"))
	res.Param("keys", ParamOf(d, "keys"))
	rate, _ := d.Lookup("msgs_per_sec")
	res.Figure("msgs_per_sec", rate, "msg/s")
	eff := math.NaN()
	if n == 1 {
		eff = 1
	} else if one > 0 {
		eff = rate / (float64(n) * one)
	}
	res.Figure("efficiency", eff, "")
	window, _ := d.Lookup("cpu_window_seconds")
	busy := func(name string) float64 {
		v, _ := d.Lookup(name)
		if window <= 0 {
			return math.NaN()
		}
		return v / window / float64(runtime.NumCPU())
	}
	res.Figure("pg_busy", busy("cpu_postgres"), "")
	res.Figure("broker_busy", busy("cpu_rabbitmq"), "")
	res.Figure("throttled", float64(throttled1-throttled0), "")
	res.Figure("rebalances", float64(rebalances), "")
	if shape == "hot" {
		res.Figure("spread_limit", spread, "×")
		if one > 0 && spread > 0 {
			res.Figure("speedup_over_spread_limit", rate/one/spread, "×")
		}
	}
	for _, f := range []string{"seconds", "node_cpu", "node_cpu_per_1k_msgs", "node_rss_peak", "cpu_postgres", "cpu_rabbitmq", "cpu_bench", "machine_busy",
		"pg_read_us_per_msg", "pg_mark_us_per_msg", "pg_relay_us_per_msg", "complete"} {
		if v, ok := d.Lookup(f); ok {
			res.Figure(f, v, unitOf(d, f))
		}
	}
	if v, ok := d.Lookup("node_cpu"); ok {
		res.Figure("node_busy", v/window/(float64(n)*o.ScaleCap), "")
	}
	res.Notes = d.Notes
	res.Check = d.Check
	res.Finished = time.Now()
	return res, nil
}

// keySpreadLimit returns, for the hot shape, the speed-up the key spread
// allows: hotKeys ÷ the most of them any one node holds (by the first
// node's map). 0 for other shapes.
func keySpreadLimit(ctx context.Context, sys measure.System, partitions int, shape string) (float64, error) {
	os, ok := sys.(*measure.OrdoSystem)
	if shape != "hot" || !ok {
		return 0, nil
	}
	st, err := os.C.Status(ctx, os.C.Running()[0])
	if err != nil {
		return 0, err
	}
	return spreadLimit(st.Assignment, partitions, "key", hotKeys), nil
}

// spreadLimit is keys ÷ the most keys prefix-0..prefix-(keys-1) that any
// one owner of assignment (owner by partition) holds.
func spreadLimit(assignment []string, partitions int, prefix string, keys int) float64 {
	per := map[string]int{}
	most := 0
	width := len(fmt.Sprint(keys - 1))
	for k := range keys {
		p := partition.Of(fmt.Sprintf("%s-%0*d", prefix, width, k), partitions)
		if p >= len(assignment) {
			return 0
		}
		per[assignment[p]]++
		most = max(most, per[assignment[p]])
	}
	if most == 0 {
		return 0
	}
	return float64(keys) / float64(most)
}

// claimsSince counts the lease claims recorded in ordo_lease_audit since
// t: each is a partition changing hands (or being taken again).
func claimsSince(ctx context.Context, r *harness.Rig, t time.Time) (int, error) {
	var n int
	err := r.Pool.QueryRow(ctx, `SELECT count(*) FROM ordo_lease_audit WHERE event = 'claim' AND at >= $1`, t).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count lease claims: %w", err)
	}
	return n, nil
}
