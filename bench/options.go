package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/bench/nemesis"
)

// Each scenario runs with options of its own type: the common flags
// (common, flags.go) and the flags it alone registers, which follow its
// name on the command line. Flags that several scenarios share are small
// embedded structs registered by one method each (backlog, traffic,
// keyedTraffic, classicPolling), so that their name, usage and check are the
// same wherever they appear. Zero Keys and Rate mean "the scenario's
// default", which the scenario's doc states. The produce, consume and
// sources scenarios' options are in their own files.

// backlog is the pending rows a drain starts from: -rows, -keys and
// -payload of drain, classic and broker.
type backlog struct {
	Rows    int // messages
	Keys    int // distinct correlation ids (0: the scenario's default)
	Payload int // approximate payload size in bytes
}

func defaultBacklog() backlog { return backlog{Rows: 100000, Payload: 300} }

func (b *backlog) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&b.Rows, "rows", b.Rows, "messages")
	keysVar(fs, &b.Keys)
	payloadVar(fs, &b.Payload)
}

func (b backlog) validate() error {
	var errs []error
	if b.Rows < 1 {
		errs = append(errs, fmt.Errorf("rows %d must be positive", b.Rows))
	}
	return errors.Join(append(errs, checkKeys(b.Keys), checkPayload(b.Payload))...)
}

// traffic is a steady producer load: -payload, -rate and -workers.
type traffic struct {
	Payload int // approximate payload size in bytes
	Rate    int // commits a second; race: orders a second (0: the scenario's default)
	Workers int // producer goroutines, one connection each
}

func defaultTraffic() traffic { return traffic{Payload: 300, Workers: 16} }

func (t *traffic) addFlags(fs *flag.FlagSet) {
	payloadVar(fs, &t.Payload)
	rateVar(fs, &t.Rate)
	workersVar(fs, &t.Workers)
}

func (t traffic) validate() error {
	return errors.Join(checkPayload(t.Payload), checkRate(t.Rate), checkWorkers(t.Workers))
}

// keyedTraffic is a steady load over -keys keys: outage, latency,
// classic-latency, failover and join.
type keyedTraffic struct {
	traffic
	Keys int // distinct correlation ids (0: the scenario's default)
}

func defaultKeyedTraffic() keyedTraffic { return keyedTraffic{traffic: defaultTraffic()} }

func (k *keyedTraffic) addFlags(fs *flag.FlagSet) {
	k.traffic.addFlags(fs)
	keysVar(fs, &k.Keys)
}

func (k keyedTraffic) validate() error { return errors.Join(k.traffic.validate(), checkKeys(k.Keys)) }

// classicPolling is how the classic relay polls: -classic-batch and
// -classic-interval of the scenarios that run it.
type classicPolling struct {
	ClassicBatch int           // rows per batch
	ClassicEvery time.Duration // polling interval
}

// defaultClassicPolling is the article's relay: 50 rows a second.
func defaultClassicPolling() classicPolling {
	return classicPolling{ClassicBatch: 50, ClassicEvery: time.Second}
}

func (c *classicPolling) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.ClassicBatch, "classic-batch", c.ClassicBatch, "classic relay: rows per batch")
	fs.DurationVar(&c.ClassicEvery, "classic-interval", c.ClassicEvery, "classic relay: polling interval")
}

func (c classicPolling) validate() error {
	if c.ClassicBatch < 1 || c.ClassicEvery <= 0 {
		return errors.New("classic-batch and classic-interval must be positive")
	}
	return nil
}

// keysVar, payloadVar, rateVar and workersVar register the flags that
// scenarios share outside the structs above.
func keysVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "keys", *p, "distinct correlation ids (0: the scenario's default)")
}

func payloadVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "payload", *p, "approximate JSON payload size in bytes")
}

func rateVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "rate", *p, "commits per second, orders per second in race (0: the scenario's default)")
}

func workersVar(fs *flag.FlagSet, p *int) {
	fs.IntVar(p, "workers", *p, "producer goroutines, one connection each")
}

func checkKeys(n int) error {
	if n < 0 {
		return fmt.Errorf("keys %d must not be negative", n)
	}
	return nil
}

func checkPayload(n int) error {
	if n < 0 || n > 1<<20 {
		return fmt.Errorf("payload %d out of range 0..1MiB", n)
	}
	return nil
}

func checkRate(n int) error {
	if n < 0 {
		return fmt.Errorf("rate %d must not be negative", n)
	}
	return nil
}

func checkWorkers(n int) error {
	if n < 1 || n > 32 {
		return fmt.Errorf("workers %d out of range 1..32", n)
	}
	return nil
}

// orDefault returns v, or def when v was left at 0 (-keys, -rate).
func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// drainOptions are drain's: a backlog drained by each count of -nodes.
type drainOptions struct {
	common
	backlog
	Analyze bool  // ANALYZE the outbox after loading it
	Nodes   []int // node counts, one run each
}

func defaultDrainOptions() drainOptions {
	return drainOptions{backlog: defaultBacklog(), Analyze: true, Nodes: []int{1}}
}

func (o *drainOptions) addFlags(fs *flag.FlagSet) {
	o.backlog.addFlags(fs)
	analyzeVar(fs, &o.Analyze)
	countsVar(fs, "nodes", &o.Nodes, "comma-separated Ordo node counts, one run each")
}

func analyzeVar(fs *flag.FlagSet, p *bool) {
	fs.BoolVar(p, "analyze", *p, "ANALYZE the outbox after loading it, as autovacuum would soon")
}

// classicOptions are classic's: drain's backlog through the classic relay
// on each count of -instances.
type classicOptions struct {
	common
	backlog
	classicPolling
	Analyze   bool  // ANALYZE the outbox after loading it
	Instances []int // instance counts, one run each
}

func defaultClassicOptions() classicOptions {
	return classicOptions{backlog: defaultBacklog(), classicPolling: defaultClassicPolling(), Analyze: true, Instances: []int{1, 2}}
}

func (o *classicOptions) addFlags(fs *flag.FlagSet) {
	o.backlog.addFlags(fs)
	o.classicPolling.addFlags(fs)
	analyzeVar(fs, &o.Analyze)
	countsVar(fs, "instances", &o.Instances, "comma-separated classic instance counts, one run each")
}

func (o classicOptions) validate() error {
	return errors.Join(o.backlog.validate(), o.classicPolling.validate())
}

// brokerOptions are broker's: a backlog published with pipelined confirms.
type brokerOptions struct {
	common
	backlog
	BrokerWindow int // unconfirmed publishes in flight
}

func defaultBrokerOptions() brokerOptions {
	return brokerOptions{backlog: defaultBacklog(), BrokerWindow: 1024}
}

func (o *brokerOptions) addFlags(fs *flag.FlagSet) {
	o.backlog.addFlags(fs)
	fs.IntVar(&o.BrokerWindow, "broker-window", o.BrokerWindow, "most unconfirmed publishes in flight")
}

func (o brokerOptions) validate() error {
	var errs []error
	if o.BrokerWindow < 1 || o.BrokerWindow > 65535 {
		errs = append(errs, fmt.Errorf("broker-window %d out of range 1..65535", o.BrokerWindow))
	}
	return errors.Join(append(errs, o.backlog.validate())...)
}

// outageOptions are outage's: a steady load while the broker link is cut.
type outageOptions struct {
	common
	keyedTraffic
	Before time.Duration // steady running before the cut
	Outage time.Duration // how long the broker link stays cut
}

func defaultOutageOptions() outageOptions {
	return outageOptions{keyedTraffic: defaultKeyedTraffic(), Before: 3 * time.Second, Outage: 10 * time.Second}
}

func (o *outageOptions) addFlags(fs *flag.FlagSet) {
	o.keyedTraffic.addFlags(fs)
	fs.DurationVar(&o.Before, "before", o.Before, "steady running before the cut")
	fs.DurationVar(&o.Outage, "outage", o.Outage, "how long the broker link stays cut")
}

func (o outageOptions) validate() error {
	var errs []error
	if o.Before < 0 || o.Outage <= 0 {
		errs = append(errs, errors.New("before must not be negative and outage must be positive"))
	}
	return errors.Join(append(errs, o.keyedTraffic.validate())...)
}

// latencyOptions are latency's: a steady load for -duration.
type latencyOptions struct {
	common
	keyedTraffic
	Duration time.Duration // how long producers run
	Warmup   time.Duration // commits in this first part are not measured
}

func defaultLatencyOptions() latencyOptions {
	return latencyOptions{keyedTraffic: defaultKeyedTraffic(), Duration: 30 * time.Second, Warmup: 2 * time.Second}
}

func (o *latencyOptions) addFlags(fs *flag.FlagSet) {
	o.keyedTraffic.addFlags(fs)
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long producers run")
	warmupVar(fs, &o.Warmup)
}

func warmupVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "warmup", *p, "commits in this first part of a run are not measured")
}

func (o latencyOptions) validate() error {
	var errs []error
	switch {
	case o.Duration <= 0 || o.Warmup < 0:
		errs = append(errs, errors.New("duration must be positive and warmup not negative"))
	case o.Warmup >= o.Duration:
		errs = append(errs, fmt.Errorf("warmup %v must be shorter than duration %v", o.Warmup, o.Duration))
	}
	return errors.Join(append(errs, o.keyedTraffic.validate())...)
}

// classicLatencyOptions are classic-latency's: latency's, through the
// classic relay on the first count of -instances.
type classicLatencyOptions struct {
	latencyOptions
	classicPolling
	Instances []int // the first is the instance count
}

func defaultClassicLatencyOptions() classicLatencyOptions {
	return classicLatencyOptions{latencyOptions: defaultLatencyOptions(), classicPolling: defaultClassicPolling(), Instances: []int{1}}
}

func (o *classicLatencyOptions) addFlags(fs *flag.FlagSet) {
	o.latencyOptions.addFlags(fs)
	o.classicPolling.addFlags(fs)
	countsVar(fs, "instances", &o.Instances, "classic instances: the first of these comma-separated counts")
}

func (o classicLatencyOptions) validate() error {
	return errors.Join(o.latencyOptions.validate(), o.classicPolling.validate())
}

// raceOptions are race's: -orders orders through the classic relay, then
// through Ordo.
type raceOptions struct {
	common
	traffic
	classicPolling
	Orders        int // orders, two messages each
	RaceInstances int // classic instances
	RaceNodes     int // Ordo nodes
}

func defaultRaceOptions() raceOptions {
	return raceOptions{traffic: defaultTraffic(), classicPolling: defaultClassicPolling(), Orders: 5000, RaceInstances: 2, RaceNodes: 3}
}

func (o *raceOptions) addFlags(fs *flag.FlagSet) {
	o.traffic.addFlags(fs)
	o.classicPolling.addFlags(fs)
	fs.IntVar(&o.Orders, "orders", o.Orders, "orders (two messages each)")
	fs.IntVar(&o.RaceInstances, "race-instances", o.RaceInstances, "classic relay instances")
	fs.IntVar(&o.RaceNodes, "race-nodes", o.RaceNodes, "Ordo nodes")
}

func (o raceOptions) validate() error {
	var errs []error
	if o.Orders < 1 {
		errs = append(errs, fmt.Errorf("orders %d must be positive", o.Orders))
	}
	if o.RaceInstances < 1 || o.RaceInstances > 8 || o.RaceNodes < 1 || o.RaceNodes > 8 {
		errs = append(errs, errors.New("race-instances and race-nodes must be 1..8"))
	}
	return errors.Join(append(errs, o.traffic.validate(), o.classicPolling.validate())...)
}

// clusterOptions are failover's and join's: -reps events on 3 nodes under
// a steady load, judged against a target.
type clusterOptions struct {
	common
	keyedTraffic
	Reps   int           // repetitions
	Target time.Duration // the target the figures are judged against
}

// failoverOptions are failover's (-failover-target), joinOptions join's
// (-join-target).
type (
	failoverOptions struct{ clusterOptions }
	joinOptions     struct{ clusterOptions }
)

func defaultFailoverOptions() failoverOptions {
	return failoverOptions{clusterOptions{keyedTraffic: defaultKeyedTraffic(), Reps: 3, Target: 3 * time.Second}}
}

func defaultJoinOptions() joinOptions {
	return joinOptions{clusterOptions{keyedTraffic: defaultKeyedTraffic(), Reps: 3, Target: 5 * time.Second}}
}

func (o *failoverOptions) addFlags(fs *flag.FlagSet) {
	o.clusterOptions.addFlags(fs, "failover-target")
}
func (o *joinOptions) addFlags(fs *flag.FlagSet) { o.clusterOptions.addFlags(fs, "join-target") }

func (o *clusterOptions) addFlags(fs *flag.FlagSet, target string) {
	o.keyedTraffic.addFlags(fs)
	fs.IntVar(&o.Reps, "reps", o.Reps, "repetitions")
	fs.DurationVar(&o.Target, target, o.Target, "target")
}

func (o clusterOptions) validate() error {
	var errs []error
	if o.Reps < 1 || o.Reps > 20 {
		errs = append(errs, fmt.Errorf("reps %d out of range 1..20", o.Reps))
	}
	return errors.Join(append(errs, o.keyedTraffic.validate())...)
}

// shapesOptions are shapes': classic against Ordo in every backlog shape.
type shapesOptions struct {
	common
	traffic // of the steady runs
	classicPolling
	Warmup      time.Duration // the steady runs' warm-up
	Shapes      []string      // the shapes to run (see shapeDefs)
	ShapeLimit  time.Duration // a drain not finished by then is reported as incomplete
	ShapeSteady time.Duration // the steady run per shape (commit latency); 0 skips it
}

func defaultShapesOptions() shapesOptions {
	return shapesOptions{traffic: defaultTraffic(), classicPolling: defaultClassicPolling(), Warmup: 2 * time.Second,
		Shapes: shapeNames(), ShapeLimit: 5 * time.Minute, ShapeSteady: 10 * time.Second}
}

func (o *shapesOptions) addFlags(fs *flag.FlagSet) {
	o.traffic.addFlags(fs)
	o.classicPolling.addFlags(fs)
	warmupVar(fs, &o.Warmup)
	listVar(fs, "shapes", "all", "comma-separated shapes ("+strings.Join(shapeNames(), ", ")+") or all", func(s string) (err error) {
		o.Shapes, err = parseShapes(s)
		return err
	})
	fs.DurationVar(&o.ShapeLimit, "shape-limit", o.ShapeLimit, "a drain not finished by then is reported as incomplete")
	fs.DurationVar(&o.ShapeSteady, "shape-steady", o.ShapeSteady, "steady run per shape for the producers' commit latency (0 skips it)")
}

func (o shapesOptions) validate() error {
	var errs []error
	if o.ShapeLimit < 0 || o.ShapeSteady < 0 || o.Warmup < 0 {
		errs = append(errs, errors.New("shape-limit, shape-steady and warmup must not be negative"))
	}
	return errors.Join(append(errs, o.traffic.validate(), o.classicPolling.validate())...)
}

// scaleoutOptions are scaleout's: capped Ordo nodes draining a backlog.
type scaleoutOptions struct {
	common
	Payload     int           // approximate payload size in bytes
	ScaleNodes  []int         // node counts
	ScaleCap    float64       // CPU cap per node, in cores
	ScalePeriod time.Duration // CFS period
	ScaleShape  []string      // many, hot
	ScaleRows   int           // rows of the many-keys backlog
	ScaleHot    int           // rows of the hot-key (10 keys) backlog
}

func defaultScaleoutOptions() scaleoutOptions {
	return scaleoutOptions{Payload: 300, ScaleNodes: []int{1, 2, 3, 4}, ScaleCap: 0.05, ScalePeriod: 10 * time.Millisecond,
		ScaleShape: []string{"many", "hot"}, ScaleRows: 40000, ScaleHot: 5000}
}

func (o *scaleoutOptions) addFlags(fs *flag.FlagSet) {
	payloadVar(fs, &o.Payload)
	countsVar(fs, "scale-nodes", &o.ScaleNodes, "comma-separated node counts")
	fs.Float64Var(&o.ScaleCap, "scale-cap", o.ScaleCap, "CPU cap per node, in cores")
	fs.DurationVar(&o.ScalePeriod, "scale-period", o.ScalePeriod, "CFS period of the caps (raised to fit the kernel's 1 ms minimum quota: 20ms for 0.05 core)")
	listVar(fs, "scale-shapes", strings.Join(o.ScaleShape, ","), "many (many keys) and/or hot (10 keys)", func(s string) (err error) {
		o.ScaleShape, err = parseScaleShapes(s)
		return err
	})
	fs.IntVar(&o.ScaleRows, "scale-rows", o.ScaleRows, "rows of the many-keys backlog (over rows/10 keys)")
	fs.IntVar(&o.ScaleHot, "scale-hot-rows", o.ScaleHot, "rows of the hot-key backlog (over 10 keys)")
}

func (o scaleoutOptions) validate() error {
	var errs []error
	if o.ScaleCap <= 0 || o.ScaleCap > 2 || o.ScalePeriod < time.Millisecond || o.ScalePeriod > time.Second {
		errs = append(errs, errors.New("scale-cap must be in (0, 2] cores and scale-period in [1ms, 1s]"))
	}
	if o.ScaleRows < 10 || o.ScaleHot < 10 {
		errs = append(errs, errors.New("scale-rows and scale-hot-rows must be at least 10"))
	}
	return errors.Join(append(errs, checkPayload(o.Payload))...)
}

// chartsOptions are charts': where the PNGs go.
type chartsOptions struct {
	common
	Charts string // the directory the PNGs go to
}

func defaultChartsOptions() chartsOptions { return chartsOptions{Charts: "docs"} }

func (o *chartsOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Charts, "charts", o.Charts, "directory for the PNGs")
}

func (o chartsOptions) validate() error { return nil }

// nemesisOptions are the nemesis scenario's.
type nemesisOptions struct {
	common
	Rate    int            // orders a second (0: the nemesis's default)
	Seed    int64          // the schedule's seed (0: drawn and printed)
	Profile string         // short (about 2 minutes) or long (10 minutes or more)
	Kinds   []nemesis.Kind // the kinds of fault to run (the others' steps are left out of the plan)
}

func defaultNemesisOptions() nemesisOptions { return nemesisOptions{Profile: nemesis.ProfileShort} }

func (o *nemesisOptions) addFlags(fs *flag.FlagSet) {
	rateVar(fs, &o.Rate)
	fs.Int64Var(&o.Seed, "seed", o.Seed, "seed of the fault schedule (0: draw one and print it)")
	fs.StringVar(&o.Profile, "profile", o.Profile, "short (about 2 minutes) or long (10 minutes or more)")
	listVar(fs, "kinds", "all", "comma-separated kinds of fault to run, or all", func(s string) (err error) {
		o.Kinds, err = nemesis.ParseKinds(s)
		return err
	})
}

func (o nemesisOptions) validate() error {
	if o.Profile != nemesis.ProfileShort && o.Profile != nemesis.ProfileLong {
		return fmt.Errorf("profile %q: want %s or %s", o.Profile, nemesis.ProfileShort, nemesis.ProfileLong)
	}
	return checkRate(o.Rate)
}

// config returns the nemesis's settings.
func (o nemesisOptions) config() nemesis.Config {
	return nemesis.Config{PostgresURL: o.PostgresURL, AMQPURL: o.AMQPURL, Out: o.Out, Partitions: o.Partitions,
		ConfirmWindow: o.ConfirmWindow, NodeBin: o.NodeBin, Timeout: o.Timeout, Rate: o.Rate,
		Seed: o.Seed, Scenario: nemesis.ScenarioRelay, Profile: o.Profile, Kinds: o.Kinds}
}
