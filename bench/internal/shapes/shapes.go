package shapes

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/steady"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// shapeDef is one backlog shape of the shapes scenario: rows
// over keys, drained on the same rows, in the same run, by the classic
// relay and by one Ordo node, with and without ANALYZE after loading
// (autovacuum off on the outbox for the run).
type shapeDef struct {
	name    string
	groups  []drain.RowGroup
	base    []drain.RowGroup // the same rows without the poison groups, drained in the same run (parked only)
	analyze []bool           // the variants: with ANALYZE, without
	classic bool             // the classic relay drains it too
	env     []string         // extra ORDO_* for the node (parked: park after one attempt)
	keys    int              // keys of the timed groups, for the steady run's producer
}

// Pseudo-shapes: not a backlog of rows.
const (
	shapeStopWait = "stopwait" // the broker with one unconfirmed publish at a time
	shapeDurable  = "durable"  // Ordo into a durable queue against the default queue
	shapeParked   = "1000x20+parked"
)

// ShapeDefs returns every shape in the order they run, scaled down 10×
// with quick: 1 key × 20,000; 10 × 2,000; 1,000 × 20; 30,000 × 1;
// 10,000 × 10 (100,000 rows); 1,000 × 20 plus 200 parked keys × 50
// followers; 100,000 × 10 (1,000,000 rows, without ANALYZE only). The
// stop-and-wait broker and the durable-queue run are the two first and
// last.
func ShapeDefs(quick bool) []shapeDef {
	s := func(full, small int) int {
		if quick {
			return small
		}
		return full
	}
	both := []bool{true, false}
	plain := func(name string, keys, rows int, analyze []bool) shapeDef {
		return shapeDef{name: name, groups: []drain.RowGroup{{Prefix: "key", Keys: keys, Rows: rows}}, analyze: analyze, classic: true, keys: keys}
	}
	others := drain.RowGroup{Prefix: "key", Keys: s(1000, 100), Rows: s(20000, 2000)}
	parked := drain.RowGroup{Prefix: "parked", Keys: s(200, 20), Rows: s(200, 20) * 51, Poison: true}
	return []shapeDef{
		{name: shapeStopWait},
		plain("1x20000", 1, s(20000, 2000), both),
		plain("10x2000", 10, s(20000, 2000), both),
		plain("1000x20", s(1000, 100), s(20000, 2000), both),
		plain("30000x1", s(30000, 3000), s(30000, 3000), both),
		plain("10000x10", s(10000, 1000), s(100000, 10000), both),
		{name: shapeParked, groups: []drain.RowGroup{others, parked}, base: []drain.RowGroup{others}, analyze: both,
			env: []string{"ORDO_MAX_ATTEMPTS=1"}, keys: others.Keys},
		plain("100000x10", s(100000, 10000), s(1000000, 100000), []bool{false}),
		{name: shapeDurable, groups: []drain.RowGroup{{Prefix: "key", Keys: s(10000, 1000), Rows: s(100000, 10000)}}, keys: s(10000, 1000)},
	}
}

// shapeNames returns every shape's name.
func shapeNames() []string {
	var out []string
	for _, d := range ShapeDefs(false) {
		out = append(out, d.name)
	}
	return out
}

// ParseShapes checks a -shapes list ("all" or comma-separated names).
func ParseShapes(s string) ([]string, error) {
	if s == "" || s == "all" {
		return shapeNames(), nil
	}
	known := map[string]bool{}
	for _, n := range shapeNames() {
		known[n] = true
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !known[f] {
			return nil, fmt.Errorf("-shapes: unknown shape %q (known: %s)", f, strings.Join(shapeNames(), ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// variantName is "ordo-analyze", "classic-noanalyze", ...
func variantName(relay string, analyze bool) string {
	if analyze {
		return relay + "-analyze"
	}
	return relay + "-noanalyze"
}

// Options are shapes': classic against Ordo in every backlog shape.
type Options struct {
	measure.Common
	measure.Traffic // of the steady runs
	measure.ClassicPolling
	Warmup      time.Duration // the steady runs' warm-up
	Shapes      []string      // the shapes to run (see ShapeDefs)
	ShapeLimit  time.Duration // a drain not finished by then is reported as incomplete
	ShapeSteady time.Duration // the steady run per shape (commit latency); 0 skips it
	// The parked shape's poison group: ParkedKeys keys (0: the shape's
	// 200) of ParkedFollowers followers each, their heads loaded parked
	// with ParkedLoaded (otherwise parked by the node during the drain),
	// and their followers loaded held behind them too with ParkedHeld.
	ParkedKeys, ParkedFollowers int
	ParkedLoaded, ParkedHeld    bool
	// Vacuum loads the parked keys first and VACUUMs the outbox before
	// loading the rows the drain times (loadVacuumed).
	Vacuum bool
	// Lean drops the producers' key_seq trigger in Ordo's runs before the
	// rows are loaded: the partition owners number them.
	Lean bool
}

func DefaultOptions() Options {
	return Options{Traffic: measure.DefaultTraffic(), ClassicPolling: measure.DefaultClassicPolling(), Warmup: 2 * time.Second,
		Shapes: shapeNames(), ShapeLimit: 5 * time.Minute, ShapeSteady: 10 * time.Second, ParkedFollowers: 50}
}

func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.Traffic.AddFlags(fs)
	o.ClassicPolling.AddFlags(fs)
	steady.WarmupVar(fs, &o.Warmup)
	measure.ListVar(fs, "shapes", "all", "comma-separated shapes ("+strings.Join(shapeNames(), ", ")+") or all", func(s string) (err error) {
		o.Shapes, err = ParseShapes(s)
		return err
	})
	fs.DurationVar(&o.ShapeLimit, "shape-limit", o.ShapeLimit, "a drain not finished by then is reported as incomplete")
	fs.DurationVar(&o.ShapeSteady, "shape-steady", o.ShapeSteady, "steady run per shape for the producers' commit latency (0 skips it)")
	fs.IntVar(&o.ParkedKeys, "parked-keys", o.ParkedKeys, "parked keys of the "+shapeParked+" shape (0: 200, 20 with -quick)")
	fs.IntVar(&o.ParkedFollowers, "parked-followers", o.ParkedFollowers, "rows waiting behind each parked key of the "+shapeParked+" shape")
	fs.BoolVar(&o.ParkedLoaded, "parked-loaded", o.ParkedLoaded, "load the "+shapeParked+" shape's poison rows parked already, instead of the node parking them during the drain")
	fs.BoolVar(&o.ParkedHeld, "parked-held", o.ParkedHeld, "with -parked-loaded, load their followers held behind them too (held_behind, outbox migration 15), as a node's first read leaves them: the drain then times the other keys beside parked keys a node has seen before")
	fs.BoolVar(&o.Lean, "lean", o.Lean, "drop the producers' key_seq trigger in Ordo's runs before loading (outbox.DropKeySeqTrigger): the relays number the rows")
	fs.BoolVar(&o.Vacuum, "vacuum", o.Vacuum, "load the parked shape's parked keys (with -parked-loaded) first, VACUUM the outbox as autovacuum would before long (the shapes run with autovacuum off), then load the rows the drain times: the dead versions and index entries of -parked-held's holds are gone")
}

// withParked sizes the parked shape's poison group as its flags say.
func (o Options) withParked(def shapeDef) shapeDef {
	if def.name != shapeParked {
		return def
	}
	groups := slices.Clone(def.groups)
	for i, g := range groups {
		if !g.Poison {
			continue
		}
		if o.ParkedKeys > 0 {
			g.Keys = o.ParkedKeys
		}
		g.Rows, g.Parked, g.Held = g.Keys*(o.ParkedFollowers+1), o.ParkedLoaded, o.ParkedLoaded && o.ParkedHeld
		groups[i] = g
	}
	def.groups = groups
	return def
}

func (o Options) Validate() error {
	var errs []error
	if o.ShapeLimit < 0 || o.ShapeSteady < 0 || o.Warmup < 0 {
		errs = append(errs, errors.New("shape-limit, shape-steady and warmup must not be negative"))
	}
	if o.ParkedKeys < 0 || o.ParkedFollowers < 0 {
		errs = append(errs, errors.New("parked-keys and parked-followers must not be negative"))
	}
	return errors.Join(append(errs, o.Traffic.Validate(), o.ClassicPolling.Validate())...)
}

// Run drains every shape of -shapes: see ShapeDefs and docs/bench.md.
// Each drain is a result of its own (scenario "shape"); each shape then
// gets a summary (scenario "shapes") with the ratios and the whole cost
// per message, and the run ends with a table of them all.
func Run(ctx context.Context, o Options, emit func(*result.Result)) error {
	want := map[string]bool{}
	for _, n := range o.Shapes {
		want[n] = true
	}
	runID := time.Now().Format("20060102-150405")
	var rows []*result.Result
	var errs []error
	stopWait := 0.0
	for _, def := range ShapeDefs(o.Quick) {
		if !want[def.name] {
			continue
		}
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		def = o.withParked(def)
		fmt.Printf("\n=== shapes: %s\n", def.name)
		sum, err := runShape(ctx, o, def, emit, stopWait)
		if err != nil {
			fmt.Printf("bench: shapes: %s: %v\n", def.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", def.name, err))
			continue
		}
		sum.Params = append([]result.Param{{Name: "shape", Value: def.name}, {Name: "run", Value: runID}}, sum.Params...)
		if def.name == shapeStopWait {
			stopWait, _ = sum.Lookup("msgs_per_sec")
		}
		emit(sum)
		rows = append(rows, sum)
	}
	printShapeTable(os.Stdout, rows)
	return errors.Join(errs...)
}

// runShape runs one shape's drains and returns its summary.
func runShape(ctx context.Context, o Options, def shapeDef, emit func(*result.Result), stopWait float64) (*result.Result, error) {
	sum := result.New("shapes")
	switch def.name {
	case shapeStopWait:
		return stopWaitRun(ctx, o, emit)
	case shapeDurable:
		return durableRun(ctx, o, def, emit)
	}
	rows, keys, parkedKeys := drain.PlanSize(def.groups)
	sum.Param("msgs", rows)
	sum.Param("keys", keys)
	if parkedKeys > 0 {
		sum.Param("parked_keys", parkedKeys)
	}
	drain := func(spec measure.SystemSpec, groups []drain.RowGroup, analyze bool, label string) (*result.Result, drain.Costs, error) {
		plan := drain.Plan{Scenario: "shape", Label: def.name + "-" + label, Groups: groups, Analyze: analyze,
			Payload: o.Payload, AutovacuumOff: true, Vacuum: o.Vacuum, Limit: o.ShapeLimit, Lean: o.Lean && !spec.Classic}
		res, costs, err := drain.Backlog(ctx, o.Common, spec, plan)
		if err != nil {
			return nil, costs, fmt.Errorf("%s: %w", label, err)
		}
		emit(res)
		return res, costs, nil
	}
	var ordoRuns []*result.Result
	for _, analyze := range def.analyze {
		if def.classic {
			res, costs, err := drain(measure.Classic(1, o.ClassicPolling), def.groups, analyze, variantName("classic", analyze))
			if err != nil {
				return nil, err
			}
			addShapeVariant(sum, "classic", analyze, res, costs)
		}
		res, costs, err := drain(measure.SystemSpec{N: 1, Env: def.env}, def.groups, analyze, variantName("ordo", analyze))
		if err != nil {
			return nil, err
		}
		addShapeVariant(sum, "ordo", analyze, res, costs)
		ordoRuns = append(ordoRuns, res)
		if def.base != nil {
			res, costs, err := drain(measure.SystemSpec{N: 1, Env: def.env}, def.base, analyze, variantName("ordo-base", analyze))
			if err != nil {
				return nil, err
			}
			addShapeVariant(sum, "ordo_base", analyze, res, costs)
		}
	}
	if keys > 1 || parkedKeys > 0 {
		stopWait = 0 // the stop-and-wait rate bounds one key only
	}
	addShapeRatios(sum, stopWait)
	sum.Check = sumChecks(ordoRuns)
	if o.ShapeSteady > 0 {
		steady, err := steadyRun(ctx, o, def.keys)
		if err != nil {
			return nil, err
		}
		emit(steady)
		for _, f := range []string{"commit_p50", "commit_p99", "achieved_rate", "pg_insert_us_per_msg", "pg_read_us_per_msg", "pg_mark_us_per_msg", "node_cpu_per_1k_msgs"} {
			if v, ok := steady.Lookup(f); ok {
				sum.Figure("steady_"+f, v, unitOf(steady, f))
			}
		}
	}
	sum.Finished = time.Now()
	return sum, nil
}

// addShapeVariant copies one drain's figures into the summary, prefixed
// with the relay and suffixed _noanalyze for the variant without ANALYZE.
func addShapeVariant(sum *result.Result, relay string, analyze bool, res *result.Result, costs drain.Costs) {
	suffix := ""
	if !analyze {
		suffix = "_noanalyze"
	}
	name := func(f string) string { return relay + "_" + f + suffix }
	for _, f := range []string{"msgs_per_sec", "complete", "node_rss_peak"} {
		if v, ok := res.Lookup(f); ok {
			sum.Figure(name(f), v, unitOf(res, f))
		}
	}
	sum.Figure(name("pg_insert_us"), measure.PerMsgMicros(costs.Insert, costs.LoadRows), "µs")
	sum.Figure(name("pg_read_us"), measure.PerMsgMicros(costs.Relay.Read, costs.Msgs), "µs")
	sum.Figure(name("pg_mark_us"), measure.PerMsgMicros(costs.Relay.Mark, costs.Msgs), "µs")
	sum.Figure(name("pg_relay_us"), measure.PerMsgMicros(costs.RelayTotal, costs.Msgs), "µs")
	if v, ok := res.Lookup("node_cpu"); ok && costs.Msgs > 0 {
		sum.Figure(name("node_us"), 1e6*v/float64(costs.Msgs), "µs")
	}
	if relay == "classic" {
		sum.Figure(name("reorders"), float64(res.Check.Reorders), "")
		sum.Figure(name("lost"), float64(res.Check.Lost), "")
	}
}

// addShapeRatios adds the ratios the issue judges: Ordo ÷ classic,
// without ÷ with ANALYZE, the parked run ÷ the same run without parked
// keys, and Ordo ÷ the broker's stop-and-wait rate (stopWait, 0 if not
// measured in this run).
func addShapeRatios(sum *result.Result, stopWait float64) {
	ratio := func(name, num, den string) {
		a, ok1 := sum.Lookup(num)
		b, ok2 := sum.Lookup(den)
		if ok1 && ok2 && b > 0 {
			sum.Figure(name, a/b, "×")
		}
	}
	ratio("ordo_over_classic", "ordo_msgs_per_sec", "classic_msgs_per_sec")
	ratio("ordo_over_classic_noanalyze", "ordo_msgs_per_sec_noanalyze", "classic_msgs_per_sec_noanalyze")
	ratio("ordo_noanalyze_over_analyze", "ordo_msgs_per_sec_noanalyze", "ordo_msgs_per_sec")
	ratio("classic_noanalyze_over_analyze", "classic_msgs_per_sec_noanalyze", "classic_msgs_per_sec")
	ratio("parked_over_base", "ordo_msgs_per_sec", "ordo_base_msgs_per_sec")
	ratio("parked_over_base_noanalyze", "ordo_msgs_per_sec_noanalyze", "ordo_base_msgs_per_sec_noanalyze")
	if stopWait > 0 {
		if v, ok := sum.Lookup("ordo_msgs_per_sec"); ok {
			sum.Figure("ordo_over_stopwait", v/stopWait, "×")
		}
	}
	// The whole cost per message, from the first Ordo variant measured.
	for _, suffix := range []string{"", "_noanalyze"} {
		ins, ok1 := sum.Lookup("ordo_pg_insert_us" + suffix)
		rd, ok2 := sum.Lookup("ordo_pg_read_us" + suffix)
		mk, ok3 := sum.Lookup("ordo_pg_mark_us" + suffix)
		if ok1 && ok2 && ok3 {
			sum.Figure("ordo_pg_read_mark_us"+suffix, rd+mk, "µs")
			sum.Figure("ordo_pg_sum_us"+suffix, ins+rd+mk, "µs")
		}
	}
}

// sumChecks adds up the checkers' counts of rs.
func sumChecks(rs []*result.Result) result.Check {
	var c result.Check
	for _, r := range rs {
		c.Total += r.Check.Total
		c.Distinct += r.Check.Distinct
		c.Duplicates += r.Check.Duplicates
		c.Redeliveries += r.Check.Redeliveries
		c.Lost += r.Check.Lost
		c.Reorders += r.Check.Reorders
		c.Gaps += r.Check.Gaps
		c.Keys = max(c.Keys, r.Check.Keys)
		c.Problems = append(c.Problems, r.Check.Problems...)
		c.LostIDs = append(c.LostIDs, r.Check.LostIDs...)
	}
	return c
}

// unitOf returns the unit of res's figure name.
func unitOf(res *result.Result, name string) string {
	for _, f := range res.Figures {
		if f.Name == name {
			return f.Unit
		}
	}
	return ""
}

// stopWaitRun measures the broker's stop-and-wait rate: the bare
// publisher with one unconfirmed publish at a time (confirm mode,
// mandatory, persistent), one key: the fastest any relay can send one
// key's messages in strict order.
func stopWaitRun(ctx context.Context, o Options, emit func(*result.Result)) (*result.Result, error) {
	so := drain.BrokerOptions{Common: o.Common, Backlog: measure.Backlog{Rows: 5000, Keys: 1, Payload: o.Payload}, BrokerWindow: 1}
	if o.Quick {
		so.Rows = 1000
	}
	res, err := drain.BrokerOnce(ctx, so)
	if err != nil {
		return nil, err
	}
	res.Label = shapeStopWait
	emit(res)
	sum := result.New("shapes")
	sum.Param("msgs", so.Rows)
	sum.Param("keys", 1)
	sum.Param("window", 1)
	for _, f := range []string{"msgs_per_sec", "confirmed_per_sec"} {
		if v, ok := res.Lookup(f); ok {
			sum.Figure(f, v, "msg/s")
		}
	}
	sum.Check = res.Check
	sum.Finished = time.Now()
	return sum, nil
}

// durableRun drains the same backlog with one Ordo node into the default
// (transient, exclusive) queue and into a durable one, side by side.
func durableRun(ctx context.Context, o Options, def shapeDef, emit func(*result.Result)) (*result.Result, error) {
	sum := result.New("shapes")
	rows, keys, _ := drain.PlanSize(def.groups)
	sum.Param("msgs", rows)
	sum.Param("keys", keys)
	var runs []*result.Result
	for _, durable := range []bool{false, true} {
		label := "default-queue"
		if durable {
			label = "durable-queue"
		}
		plan := drain.Plan{Scenario: "shape", Label: def.name + "-" + label, Groups: def.groups, Analyze: true,
			Payload: o.Payload, AutovacuumOff: true, Limit: o.ShapeLimit, Durable: durable}
		res, _, err := drain.Backlog(ctx, o.Common, measure.Ordo(1), plan)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", label, err)
		}
		emit(res)
		runs = append(runs, res)
		v, _ := res.Lookup("msgs_per_sec")
		name := "ordo_msgs_per_sec"
		if durable {
			name = "ordo_durable_msgs_per_sec"
		}
		sum.Figure(name, v, "msg/s")
	}
	a, _ := sum.Lookup("ordo_durable_msgs_per_sec")
	b, _ := sum.Lookup("ordo_msgs_per_sec")
	if b > 0 {
		sum.Figure("durable_over_default", a/b, "×")
	}
	sum.Check = sumChecks(runs)
	sum.Finished = time.Now()
	return sum, nil
}

// steadyRun is a short latency run with one Ordo node (the producers'
// commit latency and the single-row insert's cost), with keys keys.
func steadyRun(ctx context.Context, o Options, keys int) (*result.Result, error) {
	so := steady.LatencyOptions{Common: o.Common, KeyedTraffic: measure.KeyedTraffic{Traffic: o.Traffic, Keys: keys},
		Duration: o.ShapeSteady, Warmup: min(o.Warmup, o.ShapeSteady/5)}
	so.Rate = measure.OrDefault(o.Rate, 500)
	res, err := steady.LatencyOnce(ctx, so, measure.Ordo(1))
	if err != nil {
		return nil, fmt.Errorf("steady run: %w", err)
	}
	res.Label = "shape-steady"
	return res, nil
}
