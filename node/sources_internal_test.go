package node

import (
	"slices"
	"testing"

	"github.com/ordo-relay/ordo/partition"
)

// fakeEligible is the members eligible for each source.
type fakeEligible map[string][]string

func (f fakeEligible) EligibleFor(source string) []string { return f[source] }

// TestAssignSources: with one source named default the map is
// partition.Assign's; a member cut off from billing owns none of
// billing and keeps exactly its share of default.
func TestAssignSources(t *testing.T) {
	members := []string{"n1", "n2", "n3"}
	one := assignSources(fakeEligible{"default": members}, []Source{{Name: "default", Partitions: 64}})
	want, err := partition.Assign(members, 64)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(one["default"], want) {
		t.Fatalf("one source: %v, want partition.Assign's %v", one["default"], want)
	}

	sources := []Source{{Name: "default", Partitions: 12}, {Name: "billing", Partitions: 12}}
	all := assignSources(fakeEligible{"default": members, "billing": members}, sources)
	cut := assignSources(fakeEligible{"default": members, "billing": {"n1", "n2"}}, sources)
	if got := cut["billing"].Owned("n3"); len(got) != 0 {
		t.Errorf("n3, cut off from billing, owns billing partitions %v", got)
	}
	if got, want := cut["default"].Owned("n3"), all["default"].Owned("n3"); !slices.Equal(got, want) {
		t.Errorf("n3's default partitions %v once cut off from billing, want the %v it had", got, want)
	}
	for _, m := range []string{"n1", "n2"} {
		if n := len(cut["billing"].Owned(m)); n != 6 {
			t.Errorf("%s owns %d billing partitions, want 6", m, n)
		}
	}
}
