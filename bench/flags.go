package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/internal/envflag"
)

// envPrefix is the prefix of every flag's environment variable:
// ORDO_BENCH_ROWS for -rows.
const envPrefix = "ORDO_BENCH"

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
	c := measure.DefaultCommon()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	measure.AddCommonFlags(fs, &c)
	fs.Usage = envflag.Usage(fs, envPrefix, commonUsage())
	if err := parseFlags(fs, args, lookup, out); err != nil {
		return nil, hintScenarioFlag(err)
	}
	if err := c.Check(); err != nil {
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
func scenarioOptions(s *scenario, c measure.Common, args []string, lookup func(string) (string, bool), out io.Writer) (settings, []string, error) {
	o := s.options()
	*o.Base() = c
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
	if err := o.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.name, err)
	}
	return o, fs.Args(), nil
}

// scenarioFlagSet returns a flag set with s's own flags, bound to o.
func scenarioFlagSet(s *scenario, o settings) *flag.FlagSet {
	fs := flag.NewFlagSet("bench "+s.name, flag.ContinueOnError)
	o.AddFlags(fs)
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
	var c measure.Common
	commonFS := flag.NewFlagSet("", flag.ContinueOnError)
	measure.AddCommonFlags(commonFS, &c)
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
