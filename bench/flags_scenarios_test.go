package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/produce"
	"github.com/ordo-relay/ordo/bench/internal/shapes"
	"github.com/ordo-relay/ordo/bench/internal/sources"
)

func TestProduceFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	o := parseOne[produce.Options](t, none, "produce", "-produce-producers", "2,4", "-produce-rows", "1,5", "-produce-variants", "ordo-sql,bare")
	p := o.Produce
	if len(p.Producers) != 2 || p.Producers[1] != 4 || p.Rows[1] != 5 {
		t.Fatalf("producers %v, rows %v", p.Producers, p.Rows)
	}
	if strings.Join(p.Variants, ",") != "classic,ordo-sql,bare" {
		t.Fatalf("variants %v: want classic first, then the ones asked for", p.Variants)
	}
	if o := parseOne[produce.Options](t, none, "produce"); len(o.Produce.Variants) != len(produce.Variants) || o.Produce.Reps != 3 {
		t.Fatalf("defaults: variants %v, reps %d", o.Produce.Variants, o.Produce.Reps)
	}
	for _, bad := range [][]string{
		{"-produce-producers", "0"}, {"-produce-producers", "65"}, {"-produce-rows", "x"},
		{"-produce-variants", "nosuch"}, {"-produce-reps", "0"}, {"-produce-duration", "0s"},
	} {
		if _, err := parseArgs(append([]string{"produce"}, bad...), none, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestParseShapes(t *testing.T) {
	if got, err := shapes.ParseShapes("all"); err != nil || len(got) != len(shapes.ShapeDefs(false)) {
		t.Fatalf("all = %v, %v", got, err)
	}
	if got, err := shapes.ParseShapes("10x2000, stopwait"); err != nil || strings.Join(got, ",") != "10x2000,stopwait" {
		t.Fatalf("list = %v, %v", got, err)
	}
	if _, err := shapes.ParseShapes("10x2000,nosuch"); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("unknown shape: %v", err)
	}
	none := func(string) (string, bool) { return "", false }
	if o := parseOne[shapes.Options](t, none, "shapes", "-shapes", "1x20000"); len(o.Shapes) != 1 || o.Shapes[0] != "1x20000" {
		t.Fatalf("-shapes 1x20000: %v", o.Shapes)
	}
}

func TestSourcesFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	p := parseOne[sources.Options](t, none, "sources").Sources
	if !slices.Equal(p.Counts, []int{1, 2}) || p.Cap != 0.25 || p.Reps != 2 || p.Producers != 4 || p.Nodes != 1 || p.PGVersion != "15" ||
		p.Partitions != nil || !slices.Equal(p.Budget, []string{sources.BudgetShared}) || p.Trickle != 0 {
		t.Fatalf("defaults %+v", p)
	}
	env := map[string]string{"ORDO_BENCH_SOURCES_REPS": "3"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	p = parseOne[sources.Options](t, lookup, "sources", "-sources-counts", "2,1", "-sources-cap", "0.25", "-sources-node-cap", "0.5",
		"-sources-producers", "8", "-sources-period", "50ms", "-sources-partitions", "8,32", "-sources-budget", "unshared,shared",
		"-sources-duration", "0s").Sources
	if !slices.Equal(p.Counts, []int{2, 1}) || p.Cap != 0.25 || p.NodeCap != 0.5 || p.Producers != 8 ||
		p.Period != 50*time.Millisecond || p.Reps != 3 || !slices.Equal(p.Partitions, []int{8, 32}) ||
		!slices.Equal(p.Budget, []string{sources.BudgetUnshared, sources.BudgetShared}) || p.Duration != 0 {
		t.Fatalf("parsed %+v", p)
	}
	for _, bad := range [][]string{
		{"-sources-counts", "3"}, {"-sources-counts", "0"}, {"-sources-cap", "0"}, {"-sources-cap", "3"},
		{"-sources-node-cap", "-1"}, {"-sources-period", "0s"}, {"-sources-rows", "1"}, {"-sources-keys", "30000"},
		{"-sources-producers", "1"}, {"-sources-duration", "-1s"}, {"-sources-reps", "0"}, {"-sources-nodes", "9"},
		{"-sources-pg-version", "15; rm"}, {"-sources-partitions", "8"}, {"-sources-partitions", "8,16,32"},
		{"-sources-partitions", "8,0"}, {"-sources-partitions", "8,4097"}, {"-sources-partitions", "8,x"},
		{"-sources-budget", "none"}, {"-sources-budget", ""}, {"-sources-trickle", "-1"}, {"-sources-trickle", "50"},
	} {
		if _, err := parseArgs(append([]string{"sources"}, bad...), none, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
