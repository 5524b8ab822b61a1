package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/wire"
)

// sourceCounts is a flag.Value of -source-partitions items, NAME=COUNT
// each (or -source-layout items, NAME=LAYOUT): every Set appends the
// space-separated items it is given (a repeated flag, or the
// environment's list). They are checked and applied by sourcePartitions
// (sourceLayouts), after parsing.
type sourceCounts []string

func (l *sourceCounts) String() string { return strings.Join(*l, " ") }

func (l *sourceCounts) Set(v string) error {
	*l = append(*l, strings.Fields(v)...)
	return nil
}

// sourcePartitions sets the partition count of each source that
// -source-partitions names, and returns every problem of its items (see
// perSource): a count that is not one (partition.ValidateCount: 0 is
// refused too, not read as "the default") among them.
func sourcePartitions(o *options) []error {
	return perSource(o, "source-partitions", "COUNT", "the one-source form's count is -partitions", o.SourcePartitions,
		func(s *node.Source, count string) string {
			n, err := strconv.Atoi(count)
			if err != nil {
				return "the count is not a whole number: want NAME=COUNT"
			}
			if err := partition.ValidateCount(n); err != nil {
				return err.Error()
			}
			s.Partitions = n
			return ""
		})
}

// sourceLayouts sets the table layout of each source that -source-layout
// names (node.Source.Layout), and returns every problem of its items
// (see perSource); the layout's name is checked by node.Config.Validate.
func sourceLayouts(o *options) []error {
	return perSource(o, "source-layout", "LAYOUT", "the one-source form's layout is -table-layout", o.SourceLayouts,
		func(s *node.Source, layout string) string {
			s.Layout = layout
			return ""
		})
}

// perSource applies the NAME=VALUE items of a per-source flag to the
// sources they name (set returns a problem of the value, or ""), and
// returns every problem, each naming the flag: an item that is not
// NAME=VALUE, a name that is not one of -source's, a name given twice.
// An item is quoted only by its name, once the name is a valid one: a
// URL given here by mistake may hold a password.
func perSource(o *options, flagName, value, oneSource string, items []string, set func(*node.Source, string) string) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("-%s (%s): %s", flagName, envOf(flagName), fmt.Sprintf(format, args...)))
	}
	seen := map[string]bool{}
	for _, item := range items {
		name, v, ok := strings.Cut(item, "=")
		if !ok || wire.ValidateSource(name) != nil {
			bad("an item is not NAME=%s, NAME a source name (%s)", value, "[a-z][a-z0-9_-]*, 1 to 32 bytes")
			continue
		}
		i := slices.IndexFunc(o.Sources, func(s node.Source) bool { return s.Name == name })
		var into node.Source
		problem := set(&into, v)
		if problem != "" {
			bad("source %q: %s", name, problem)
		}
		switch {
		case seen[name]:
			bad("source %q is given twice", name)
		case len(o.Sources) == 0:
			bad("source %q: there is no -source (%s); %s", name, envOf("source"), oneSource)
		case i < 0:
			bad("source %q is not one of -source (%s)", name, envOf("source"))
		case problem == "":
			set(&o.Sources[i], v)
		}
		seen[name] = true
	}
	return errs
}
