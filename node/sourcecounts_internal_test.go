package node

import (
	"slices"
	"testing"

	"github.com/ordo-relay/ordo/partition"
)

// TestConfigSourcesCounts: Config.sources gives every source its count,
// its own or else the node's Partitions, in the one-source form too, and
// leaves Config.Sources as it was.
func TestConfigSourcesCounts(t *testing.T) {
	c := DefaultConfig()
	c.Partitions = 8
	if got := c.sources(); len(got) != 1 || got[0].Partitions != 8 {
		t.Errorf("one-source form: %+v, want default with 8 partitions", got)
	}
	c.Sources = []Source{{Name: "default", PostgresURL: "postgres://h/a"}, {Name: "billing", PostgresURL: "postgres://h/b", Partitions: 16}}
	want := []Source{{Name: "default", PostgresURL: "postgres://h/a", Partitions: 8}, {Name: "billing", PostgresURL: "postgres://h/b", Partitions: 16}}
	if got := c.sources(); !slices.Equal(got, want) {
		t.Errorf("sources %+v, want %+v", got, want)
	}
	if c.Sources[0].Partitions != 0 {
		t.Errorf("sources() wrote into Config.Sources: %+v", c.Sources)
	}
}

// TestAssignSourcesOwnCounts: the node's map gives each source as many
// partitions as its own count, and is partition.AssignSources with those
// counts (TestAssignSourcesGolden pins default/8 billing/16); with a
// member cut off from billing it owns none of billing's 16.
func TestAssignSourcesOwnCounts(t *testing.T) {
	members := []string{"n1", "n2", "n3"}
	sources := []Source{{Name: "default", Partitions: 8}, {Name: "billing", Partitions: 16}}
	got := assignSources(fakeEligible{"default": members, "billing": members}, sources)
	want, err := partition.AssignSources(members, []partition.Source{{Name: "default", Count: 8}, {Name: "billing", Count: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Diff(want); d != nil || len(got["default"]) != 8 || len(got["billing"]) != 16 {
		t.Fatalf("assignSources = %q, want partition.AssignSources's %q", got, want)
	}
	for _, m := range members {
		if l := got.Load(m); l != 8 {
			t.Errorf("%s owns %d pairs, want 24/3", m, l)
		}
	}
	cut := assignSources(fakeEligible{"default": members, "billing": {"n1", "n2"}}, sources)
	if len(cut["billing"]) != 16 || len(cut["billing"].Owned("n3")) != 0 || len(cut["billing"].Owned("n1")) != 8 {
		t.Errorf("n3 cut off from billing: billing %q, want 16 partitions, 8 each to n1 and n2", cut["billing"])
	}
}
