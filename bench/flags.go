package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ordo-relay/ordo/internal/envflag"
	"github.com/ordo-relay/ordo/partition"
)

// envPrefix is the prefix of every flag's environment variable:
// ORDO_BENCH_ROWS for -rows.
const envPrefix = "ORDO_BENCH"

// common are the flags every scenario shares. They come before the first
// scenario's name: go run ./bench -quick -node-bin /tmp/node drain.
type common struct {
	PostgresURL   string        // admin URL: the bench creates its databases through it
	AMQPURL       string        // broker; the consumer always connects here directly
	Out           string        // directory for the JSON results
	Partitions    int           // P, given to the node and to outbox.Migrate
	ConfirmWindow int           // W, given to the node
	NodeBin       string        // a prebuilt node binary; empty builds ./cmd/node
	Timeout       time.Duration // bound on every wait of a scenario
	Quick         bool          // smaller defaults for a quick look (quickDefaults)
}

// defaultCommon returns the common flags' defaults.
func defaultCommon() common {
	return common{
		PostgresURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		AMQPURL:     "amqp://guest:guest@127.0.0.1:5672/", Out: "bench/results",
		Partitions: partition.DefaultCount, ConfirmWindow: 512, Timeout: 10 * time.Minute,
	}
}

// addCommonFlags registers the common flags on fs.
func addCommonFlags(fs *flag.FlagSet, c *common) {
	fs.StringVar(&c.PostgresURL, "postgres-url", c.PostgresURL, "PostgreSQL admin URL (the bench creates and drops its own databases)")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL")
	fs.StringVar(&c.Out, "out", c.Out, "directory for the JSON results")
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "partition count P")
	fs.IntVar(&c.ConfirmWindow, "confirm-window", c.ConfirmWindow, "the node's confirm window W")
	fs.StringVar(&c.NodeBin, "node-bin", c.NodeBin, "prebuilt node binary (default: go build -tags ordobench ./cmd/node)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on every wait")
	fs.BoolVar(&c.Quick, "quick", c.Quick, "smaller defaults for a quick look: rows 20000, keys 2000, duration 10s, orders 1000, reps 1, "+
		"scale-rows 2000, scale-hot-rows 500, consume-orders 300, consume-latency 3s (a scenario's flags given win)")
}

// listFlag is a flag whose text set parses into a field of options.
type listFlag struct {
	text string
	set  func(string) error
}

func (f *listFlag) String() string {
	if f == nil {
		return ""
	}
	return f.text
}

func (f *listFlag) Set(s string) error {
	if err := f.set(s); err != nil {
		return err
	}
	f.text = s
	return nil
}

// listVar registers a list flag whose default text is def.
func listVar(fs *flag.FlagSet, name, def, usage string, set func(string) error) {
	fs.Var(&listFlag{text: def, set: set}, name, usage)
}

// countsVar registers a flag of comma-separated counts from 1 to 8
// (parseCounts) bound to p, with *p as its default.
func countsVar(fs *flag.FlagSet, name string, p *[]int, usage string) {
	listVar(fs, name, joinInts(*p), usage, func(s string) (err error) {
		*p, err = parseCounts(name, s)
		return err
	})
}

// joinInts is "1,2,3".
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// quickDefaults are what -quick changes, by flag name: each applies to a
// scenario that has the flag and was not given it (on the command line or
// in the environment).
var quickDefaults = []struct{ name, value string }{
	{"rows", "20000"},
	{"keys", "2000"},
	{"duration", "10s"},
	{"orders", "1000"},
	{"reps", "1"},
	{"scale-rows", "2000"},
	{"scale-hot-rows", "500"},
	{"consume-orders", "300"},
	{"consume-latency", "3s"},
}

// check reports the common flags out of range.
func (c common) check() error {
	var errs []error
	if c.ConfirmWindow < 1 || c.ConfirmWindow > 65535 {
		errs = append(errs, fmt.Errorf("confirm-window %d out of range 1..65535", c.ConfirmWindow))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("timeout %v must be positive", c.Timeout))
	}
	return errors.Join(append(errs, partition.ValidateCount(c.Partitions))...)
}

// base returns the common flags of the options that embed c.
func (c *common) base() *common { return c }

// invocation is one scenario to run, with its options (a pointer to the
// scenario's own options type).
type invocation struct {
	s *scenario
	o settings
}

// errNoScenarioFlag is returned for a scenario's flag given before any
// scenario's name.
var errNoScenarioFlag = errors.New("a scenario's flags follow its name")

// notItsFlagError is returned for a flag given after a scenario's name
// that the scenario does not take: another scenario's, a common flag, or
// no flag at all.
type notItsFlagError struct {
	Flag     string   // without its dash
	Scenario string   // the scenario it was given to
	Common   bool     // it is a common flag
	Owners   []string // the scenarios that take it
}

func (e *notItsFlagError) Error() string {
	switch {
	case e.Common:
		return fmt.Sprintf("-%s is a common flag: it goes before the first scenario's name", e.Flag)
	case len(e.Owners) == 0:
		return fmt.Sprintf("-%s is not a flag of %s, nor of any scenario (go run ./bench %s -h lists its flags)", e.Flag, e.Scenario, e.Scenario)
	}
	return fmt.Sprintf("-%s is not a flag of %s but of %s (go run ./bench %s -h lists its flags)",
		e.Flag, e.Scenario, strings.Join(e.Owners, ", "), e.Scenario)
}

// parseArgs parses go run ./bench's arguments:
//
//	[common flags] [scenario [its flags]]... | all | compare
//
// Without a scenario, compare runs; all runs every scenario but compare,
// each with its defaults. Every flag not given is read from
// ORDO_BENCH_<FLAG> (through lookup) when set there. Help (-h) is written
// to out and returned as flag.ErrHelp.
func parseArgs(args []string, lookup func(string) (string, bool), out io.Writer) ([]invocation, error) {
	c := defaultCommon()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	addCommonFlags(fs, &c)
	fs.Usage = envflag.Usage(fs, envPrefix, commonUsage())
	if err := parseFlags(fs, args, lookup, out); err != nil {
		return nil, hintScenarioFlag(err)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	args = fs.Args()
	if len(args) == 0 {
		args = []string{compareScenario.name}
	}
	var run []invocation
	for len(args) > 0 {
		name := args[0]
		args = args[1:]
		if name == "all" {
			for i := range scenarios {
				o, _, err := scenarioOptions(&scenarios[i], c, nil, lookup, out)
				if err != nil {
					return nil, err
				}
				run = append(run, invocation{&scenarios[i], o})
			}
			continue
		}
		s := findScenario(name)
		if s == nil {
			return nil, fmt.Errorf("unknown scenario %q (go run ./bench -h lists them)", name)
		}
		o, rest, err := scenarioOptions(s, c, args, lookup, out)
		if err != nil {
			return nil, err
		}
		run = append(run, invocation{s, o})
		args = rest
	}
	return run, nil
}

// parseFlags parses args and then the environment into fs. The flag
// package's own messages are discarded: its error is returned, and only
// help is written to out.
func parseFlags(fs *flag.FlagSet, args []string, lookup func(string) (string, bool), out io.Writer) error {
	fs.SetOutput(io.Discard)
	err := envflag.Parse(fs, envPrefix, args, lookup)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
	}
	return err
}

// scenarioOptions parses s's flags from args, which start right after its
// name, into s's defaults over the common flags c, and returns the options
// and the arguments after s's flags.
func scenarioOptions(s *scenario, c common, args []string, lookup func(string) (string, bool), out io.Writer) (settings, []string, error) {
	o := s.options()
	*o.base() = c
	fs := scenarioFlagSet(s, o)
	if err := parseFlags(fs, args, lookup, out); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.name, notItsFlag(s, err))
	}
	if c.Quick {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		for _, q := range quickDefaults {
			if fs.Lookup(q.name) != nil && !given[q.name] {
				if err := fs.Set(q.name, q.value); err != nil {
					return nil, nil, fmt.Errorf("%s: -quick: %w", s.name, err)
				}
			}
		}
	}
	if err := o.validate(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.name, err)
	}
	return o, fs.Args(), nil
}

// scenarioFlagSet returns a flag set with s's own flags, bound to o.
func scenarioFlagSet(s *scenario, o settings) *flag.FlagSet {
	fs := flag.NewFlagSet("bench "+s.name, flag.ContinueOnError)
	o.addFlags(fs)
	fs.Usage = envflag.Usage(fs, envPrefix, fmt.Sprintf("usage: go run ./bench [common flags] %s [flags] [next scenario [its flags]]...\n\n%s: %s\n\n"+
		"The common flags (go run ./bench -h) come before the first scenario's name.", s.name, s.name, s.summary))
	return fs
}

// flagOwners returns the scenarios that take the flag name, in the order
// go run ./bench -h lists them.
func flagOwners(name string) []string {
	var owners []string
	for _, s := range allScenarios() {
		if scenarioFlagSet(s, s.options()).Lookup(name) != nil {
			owners = append(owners, s.name)
		}
	}
	return owners
}

// notItsFlag turns the flag package's "flag provided but not defined"
// for a flag after s's name into a *notItsFlagError.
func notItsFlag(s *scenario, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	var c common
	commonFS := flag.NewFlagSet("", flag.ContinueOnError)
	addCommonFlags(commonFS, &c)
	return &notItsFlagError{Flag: name, Scenario: s.name, Common: commonFS.Lookup(name) != nil, Owners: flagOwners(name)}
}

// commonUsage is go run ./bench -h's text before the common flags.
func commonUsage() string {
	var names []string
	for _, s := range allScenarios() {
		names = append(names, fmt.Sprintf("  %-16s %s", s.name, s.summary))
	}
	return "usage: go run ./bench [common flags] [scenario [its flags]]... | all | compare\n\n" +
		"Without a scenario, compare runs; all runs every scenario below with its defaults.\n" +
		"A scenario's own flags follow its name: go run ./bench <scenario> -h lists them.\n\nScenarios:\n" +
		strings.Join(names, "\n")
}

// hintScenarioFlag adds, to an unknown common flag, that a scenario's
// flags follow its name, and which scenarios take it.
func hintScenarioFlag(err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	if owners := flagOwners(name); len(owners) > 0 {
		return fmt.Errorf("-%s is a flag of %s (%w: go run ./bench [common flags] <scenario> [its flags])",
			name, strings.Join(owners, ", "), errNoScenarioFlag)
	}
	return fmt.Errorf("%w (%w: go run ./bench [common flags] <scenario> [its flags])", err, errNoScenarioFlag)
}
