package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ordo-relay/ordo/node"
)

// TestParseConfigSourcePartitions: -source-partitions NAME=COUNT is
// repeatable, ORDO_SOURCE_PARTITIONS takes space-separated pairs, it may
// come before -source or from another place than -source, the command
// line beats the environment, and a source without one keeps 0 (the
// node's -partitions). Each check refuses on its own, naming the flag and
// its variable, and every problem is reported at once.
func TestParseConfigSourcePartitions(t *testing.T) {
	two := []string{"-source", "default=postgres://h/a", "-source", "billing=postgres://h/b"}
	counts := func(d, b int) []node.Source {
		return []node.Source{{Name: "default", PostgresURL: "postgres://h/a", Partitions: d},
			{Name: "billing", PostgresURL: "postgres://h/b", Partitions: b}}
	}
	const flag = "-source-partitions (ORDO_SOURCE_PARTITIONS): "
	for _, c := range []struct {
		name string
		args []string
		env  func(string) (string, bool)
		want []node.Source
		errs []string // substrings of the error; none: accepted
	}{
		{"none", two, env(), counts(0, 0), nil},
		{"flags", append([]string{"-source-partitions", "billing=16", "-source-partitions", "default=8"}, two...), env(), counts(8, 16), nil},
		{"one of two", append(two, "-source-partitions", "billing=16"), env(), counts(0, 16), nil},
		{"environment", two, env("ORDO_SOURCE_PARTITIONS", " billing=16  default=8"), counts(8, 16), nil},
		{"sources from the environment", []string{"-source-partitions", "billing=16"},
			env("ORDO_SOURCES", "default=postgres://h/a billing=postgres://h/b"), counts(0, 16), nil},
		{"flag beats environment", append(two, "-source-partitions", "billing=16"), env("ORDO_SOURCE_PARTITIONS", "billing=32 default=8"), counts(0, 16), nil},
		{"max", append(two, "-source-partitions", "billing=4096"), env(), counts(0, 4096), nil},

		{"unknown source", append(two, "-source-partitions", "orders=16"), env(), nil,
			[]string{flag + `source "orders" is not one of -source (ORDO_SOURCES)`}},
		{"one-source form", []string{"-source-partitions", "default=16"}, env(), nil,
			[]string{flag + `source "default": there is no -source (ORDO_SOURCES); the one-source form's count is -partitions`}},
		{"zero", append(two, "-source-partitions", "billing=0"), env(), nil, []string{flag + `source "billing": partition count out of range: 0`}},
		{"above the max", append(two, "-source-partitions", "billing=4097"), env(), nil, []string{flag + `source "billing": partition count out of range: 4097`}},
		{"not a number", append(two, "-source-partitions", "billing=sixteen"), env(), nil,
			[]string{flag + `source "billing": the count is not a whole number`}},
		{"given twice", append(two, "-source-partitions", "billing=16", "-source-partitions", "billing=16"), env(), nil,
			[]string{flag + `source "billing" is given twice`}},
		{"given twice in the environment", two, env("ORDO_SOURCE_PARTITIONS", "billing=16 billing=8"), nil,
			[]string{flag + `source "billing" is given twice`}},
		{"not a pair", append(two, "-source-partitions", "16"), env(), nil, []string{flag + "an item is not NAME=COUNT"}},
		{"a URL by mistake", append(two, "-source-partitions", "postgres://u:secret@h/b?sslmode=disable"), env(), nil,
			[]string{flag + "an item is not NAME=COUNT"}},
		{"every problem at once", append(two, "-source-partitions", "orders=16", "-source-partitions", "billing=0",
			"-source-partitions", "default=8", "-source-partitions", "default=8", "-source-partitions", "x", "-partitions", "0"), env(), nil,
			[]string{"5 problems", `"orders" is not one of`, `"billing": partition count out of range: 0`, `"default" is given twice`,
				"an item is not NAME=COUNT", "-partitions (ORDO_PARTITIONS)"}},
	} {
		t.Run(c.name, func(t *testing.T) { checkSourcesParse(t, c.args, c.env, c.want, c.errs) })
	}
}

// TestPrintStatusSourceCounts: `node status` counts each source's own
// partitions in its total.
func TestPrintStatusSourceCounts(t *testing.T) {
	var b bytes.Buffer
	printStatus(&b, node.Status{Node: "n1", Partitions: 8, Held: []int{0, 1},
		Sources: []node.SourceStatus{{Name: "default", Partitions: 8, Held: []int{0, 1}}, {Name: "billing", Partitions: 16, Held: []int{3, 4, 5}}}})
	if want := "node n1: 5 of 24 partitions held"; !strings.Contains(b.String(), want) {
		t.Errorf("status does not say %q:\n%s", want, b.String())
	}
	if want := "source billing (reachable: false): 3 of 16 partitions held"; !strings.Contains(b.String(), "3 of 16 partitions held") {
		t.Errorf("status does not say %q:\n%s", want, b.String())
	}
}
