package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/steady"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// runCompare runs, in one go: broker; classic with 1 and 2 instances;
// drain with 1, 2 and 3 Ordo nodes; latency with Ordo and with the classic
// relay at the same rate; race (classic 2 instances, Ordo 3 nodes);
// failover; join. Every result is printed and written as it comes; at the
// end a table compares them (ratios, targets, RSS), which is also emitted
// as the "compare" result. A scenario that fails is reported and the rest
// still run.
func runCompare(ctx context.Context, o compareOptions, emit func(*result.Result)) error {
	var got []*result.Result
	collect := func(res *result.Result) {
		got = append(got, res)
		emit(res)
	}
	start := time.Now()
	var errs []error
	for _, s := range o.steps() {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		fmt.Printf("\n=== compare: %s (%v into the run)\n", s.name, time.Since(start).Round(time.Second))
		*s.o.Base() = o.Common
		if err := s.run(ctx, collect); err != nil {
			fmt.Fprintf(os.Stderr, "bench: compare: %s: %v\n", s.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	}
	cmp := buildComparison(got, o)
	res := result.New("compare")
	res.Param("scenarios", len(got))
	res.Seconds("run_seconds", time.Since(start))
	for _, row := range cmp {
		if row.key != "" && !math.IsNaN(row.ratio) {
			res.Figure(row.key, row.ratio, row.unit)
		}
	}
	for _, r := range got {
		if !r.Passed() {
			res.Note("%s %s: the checker found a problem", r.Scenario, r.Label)
		}
	}
	res.Finished = time.Now()
	fmt.Println()
	printComparison(os.Stdout, cmp)
	emit(res)
	return errors.Join(errs...)
}

// compareOptions are compare's: the options of every scenario it runs.
// Each of its flags sets the flag of that name of every step that has it
// (-rows: broker's, classic's and drain's), but -nodes and -instances:
// compare runs drain on 1, 2 and 3 nodes and classic on 1 and 2
// instances.
type compareOptions struct {
	measure.Common
	broker         drain.BrokerOptions
	classic        drain.ClassicOptions
	drain          drain.Options
	latency        steady.LatencyOptions
	classicLatency steady.ClassicLatencyOptions
	race           steady.RaceOptions
	failover       steady.FailoverOptions
	join           steady.JoinOptions
}

func defaultCompareOptions() compareOptions {
	o := compareOptions{broker: drain.DefaultBrokerOptions(), classic: drain.DefaultClassicOptions(), drain: drain.DefaultOptions(),
		latency: steady.DefaultLatencyOptions(), classicLatency: steady.DefaultClassicLatencyOptions(), race: steady.DefaultRaceOptions(),
		failover: steady.DefaultFailoverOptions(), join: steady.DefaultJoinOptions()}
	o.drain.Nodes = []int{1, 2, 3}
	o.classic.Instances = []int{1, 2}
	o.classicLatency.Instances = []int{1}
	return o
}

// compareStep is a scenario compare runs: its options (a pointer into
// compareOptions) and its run with them.
type compareStep struct {
	name string
	o    settings
	run  func(context.Context, func(*result.Result)) error
}

// steps are the scenarios compare runs, in order.
func (o *compareOptions) steps() []compareStep {
	type emitter = func(*result.Result)
	return []compareStep{
		{"broker", &o.broker, func(ctx context.Context, e emitter) error { return drain.RunBroker(ctx, o.broker, e) }},
		{"classic", &o.classic, func(ctx context.Context, e emitter) error { return drain.RunClassic(ctx, o.classic, e) }},
		{"drain", &o.drain, func(ctx context.Context, e emitter) error { return drain.Run(ctx, o.drain, e) }},
		{"latency", &o.latency, func(ctx context.Context, e emitter) error { return steady.RunLatency(ctx, o.latency, e) }},
		{"classic-latency", &o.classicLatency, func(ctx context.Context, e emitter) error {
			return steady.RunClassicLatency(ctx, o.classicLatency, e)
		}},
		{"race", &o.race, func(ctx context.Context, e emitter) error { return steady.RunRace(ctx, o.race, e) }},
		{"failover", &o.failover, func(ctx context.Context, e emitter) error { return steady.RunFailover(ctx, o.failover, e) }},
		{"join", &o.join, func(ctx context.Context, e emitter) error { return steady.RunJoin(ctx, o.join, e) }},
	}
}

// AddFlags registers, for every flag of a step but -nodes and
// -instances, one flag that sets it in every step that has it.
func (o *compareOptions) AddFlags(fs *flag.FlagSet) {
	for _, s := range o.steps() {
		own := flag.NewFlagSet(s.name, flag.ContinueOnError)
		s.o.AddFlags(own)
		own.VisitAll(func(f *flag.Flag) {
			if f.Name == "nodes" || f.Name == "instances" {
				return
			}
			if g := fs.Lookup(f.Name); g != nil {
				g.Value.(*fanout).flags = append(g.Value.(*fanout).flags, f)
				return
			}
			fs.Var(&fanout{flags: []*flag.Flag{f}}, f.Name, f.Usage)
		})
	}
}

func (o compareOptions) Validate() error {
	var errs []error
	for _, s := range o.steps() {
		if err := s.o.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

// fanout is a flag of compare's that sets the flags of the same name of
// several scenarios. Its default is the first's.
type fanout struct {
	flags []*flag.Flag
}

func (f *fanout) String() string {
	if f == nil || len(f.flags) == 0 {
		return ""
	}
	return f.flags[0].Value.String()
}

func (f *fanout) Set(s string) error {
	for _, g := range f.flags {
		if err := g.Value.Set(s); err != nil {
			return err
		}
	}
	return nil
}

// IsBoolFlag lets a boolean flag (-analyze) be given without a value.
func (f *fanout) IsBoolFlag() bool {
	if len(f.flags) == 0 {
		return false
	}
	b, ok := f.flags[0].Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// comparisonRow is one line of the final table.
type comparisonRow struct {
	what  string  // what is measured
	value string  // its value(s), formatted
	vs    string  // what it is compared with
	ratio float64 // the ratio or figure for the JSON; NaN when not measured
	shown string  // the ratio as shown
	key   string  // figure name in the compare result ("" for none)
	unit  string
}

// buildComparison picks the figures out of the results of one compare run.
func buildComparison(rs []*result.Result, o compareOptions) []comparisonRow {
	fig := func(scenario, label, name string) float64 {
		for _, r := range rs {
			if r.Scenario == scenario && (label == "" || r.Label == label) {
				if v, ok := r.Lookup(name); ok {
					return v
				}
			}
		}
		return math.NaN()
	}
	var rows []comparisonRow
	rate := func(what, key string, v, base float64, vs string) {
		rows = append(rows, comparisonRow{what: what, value: fmtRate(v), vs: vs,
			ratio: v / base, shown: fmtRatio(v / base), key: key, unit: "x"})
	}
	broker := fig("broker", "", "msgs_per_sec")
	c1 := fig("classic", "classic-1", "msgs_per_sec")
	c2 := fig("classic", "classic-2", "msgs_per_sec")
	d1 := fig("drain", "ordo-1", "msgs_per_sec")
	d2 := fig("drain", "ordo-2", "msgs_per_sec")
	d3 := fig("drain", "ordo-3", "msgs_per_sec")
	rows = append(rows, comparisonRow{what: "broker ceiling (bare publisher, confirms pipelined)", value: fmtRate(broker), ratio: broker, key: "broker_msgs_per_sec", unit: "msg/s", shown: ""})
	rate("classic drain, 1 instance", "classic1_over_broker", c1, broker, "broker ceiling")
	rate("classic drain, 2 instances", "classic2_over_classic1", c2, c1, "classic, 1 instance")
	rate("Ordo drain, 1 node", "ordo1_over_broker", d1, broker, "broker ceiling")
	rate("Ordo drain, 1 node", "ordo1_over_classic1", d1, c1, "classic, 1 instance")
	rate("Ordo drain, 1 node", "ordo1_over_classic2", d1, c2, "classic, 2 instances")
	rate("Ordo drain, 2 nodes", "ordo2_over_ordo1", d2, d1, "Ordo, 1 node")
	rate("Ordo drain, 3 nodes", "ordo3_over_ordo1", d3, d1, "Ordo, 1 node")

	for _, q := range []string{"p50", "p99"} {
		lo := fig("latency", "ordo-1", "latency_"+q)
		lc := fig("classic-latency", "", "latency_"+q)
		rows = append(rows, comparisonRow{
			what: "latency " + q + ", Ordo 1 node vs classic " + fmt.Sprint(o.classicLatency.Instances[0]) + " instance(s)", value: fmtMs(lo) + " vs " + fmtMs(lc),
			vs: "classic ÷ Ordo", ratio: lc / lo, shown: fmtRatio(lc / lo), key: "latency_" + q + "_classic_over_ordo", unit: "x",
		})
	}
	ar := fig("latency", "ordo-1", "achieved_rate")
	rows = append(rows, comparisonRow{what: "latency: commits achieved (both runs)", value: fmtRate(ar) + " vs " + fmtRate(fig("classic-latency", "", "achieved_rate")), ratio: math.NaN()})

	rc := fig("race", "classic-"+fmt.Sprint(o.race.RaceInstances), "reversed")
	ro := fig("race", "ordo-"+fmt.Sprint(o.race.RaceNodes), "reversed")
	rows = append(rows, comparisonRow{
		what:  fmt.Sprintf("race: orders Cancelled-before-Placed, classic %d vs Ordo %d", o.race.RaceInstances, o.race.RaceNodes),
		value: fmtCount(rc) + " vs " + fmtCount(ro), vs: fmt.Sprintf("of %s orders", fmtCount(fig("race", "classic-"+fmt.Sprint(o.race.RaceInstances), "orders_committed"))),
		ratio: ro, shown: verdict(ro == 0, "Ordo none", "Ordo reversed some!"), key: "race_ordo_reversed",
	})
	rows = append(rows, comparisonRow{what: "race: checker reorders, classic vs Ordo",
		value: fmtCount(countOf(rs, "race", "classic-"+fmt.Sprint(o.race.RaceInstances))) + " vs " + fmtCount(countOf(rs, "race", "ordo-"+fmt.Sprint(o.race.RaceNodes))), ratio: math.NaN()})

	fo := fig("failover", "", "publish_again_seconds_max")
	rows = append(rows, comparisonRow{what: "failover: kill -9 → its partitions publish again (max of reps)", value: fmtSec(fo),
		vs: "target " + fmtSec(o.failover.Target.Seconds()), ratio: fo, shown: verdict(fo <= o.failover.Target.Seconds(), "within", "ABOVE"), key: "failover_seconds_max", unit: "s"})
	fc := fig("failover", "", "claimed_seconds_max")
	rows = append(rows, comparisonRow{what: "failover: kill -9 → all claimed in ordo_lease_audit (max)", value: fmtSec(fc), ratio: fc, key: "failover_claimed_seconds_max", unit: "s"})
	jn := fig("join", "", "join_seconds_max")
	rows = append(rows, comparisonRow{what: "join: 3rd node start → converged and publishing (max of reps)", value: fmtSec(jn),
		vs: "target " + fmtSec(o.join.Target.Seconds()), ratio: jn, shown: verdict(jn <= o.join.Target.Seconds(), "within", "ABOVE"), key: "join_seconds_max", unit: "s"})
	jl := fig("join", "", "join_from_started_line_seconds_max")
	rows = append(rows, comparisonRow{what: "join: from its \"node started\" line (max)", value: fmtSec(jl), ratio: jl, key: "join_from_started_line_seconds_max", unit: "s"})

	var rss []string
	for _, x := range []struct{ scenario, label, name string }{
		{"drain", "ordo-1", "drain 1 node"}, {"drain", "ordo-3", "drain 3 nodes"},
		{"latency", "ordo-1", "latency"}, {"failover", "", "failover"}, {"join", "", "join"},
	} {
		if v := fig(x.scenario, x.label, "node_rss_peak"); !math.IsNaN(v) {
			rss = append(rss, fmt.Sprintf("%s %.0f", x.name, v))
		}
	}
	rows = append(rows, comparisonRow{what: "node RSS peak, MiB (largest node)", value: strings.Join(rss, ", "), ratio: fig("drain", "ordo-1", "node_rss_peak"), key: "drain_node_rss_peak", unit: "MiB"})
	cpu := fig("drain", "ordo-1", "node_cpu_per_1k_msgs")
	rows = append(rows, comparisonRow{what: "node CPU per 1,000 messages, drain 1 node", value: fmt.Sprintf("%.3f s", cpu), ratio: cpu, key: "drain_node_cpu_per_1k_msgs", unit: "s"})
	return rows
}

// countOf returns the checker's reorders of one result, NaN when absent.
func countOf(rs []*result.Result, scenario, label string) float64 {
	for _, r := range rs {
		if r.Scenario == scenario && r.Label == label {
			return float64(r.Check.Reorders)
		}
	}
	return math.NaN()
}

func printComparison(w io.Writer, rows []comparisonRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "COMPARISON\tvalue\tcompared with\tratio / verdict")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.what, r.value, r.vs, r.shown)
	}
	_ = tw.Flush()
}

func verdict(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

func fmtRate(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%s msg/s", measure.Thousands(int64(math.Round(v))))
}

func fmtRatio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}

func fmtMs(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f ms", v)
}

func fmtSec(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.2f s", v)
}

func fmtCount(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return measure.Thousands(int64(v))
}
