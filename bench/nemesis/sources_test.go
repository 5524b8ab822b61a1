package nemesis

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/node"
)

// TestIsolationCheck: a source-link step passes only when the other
// source was seen relaying on the cut node: a delivery of that source, on
// a partition the node held at the cut, at the epoch of its lease then,
// within the check's window.
func TestIsolationCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	window := func() []stepWindow {
		return []stepWindow{
			{Label: "warm-up", Start: t0, End: ms(100), Bound: 3},
			{Label: "step 1: source-link", Kind: kindSourceLink, Start: ms(100), End: ms(1000), Bound: 1,
				Isolation: &isolationCheck{Node: "n2", Source: "default", Held: map[int]int64{3: 7, 5: 2}, From: ms(300), To: ms(600), Kept: 2}},
		}
	}
	at := func(h *hist, n int) *hist { h.ds[len(h.ds)-1].Received = ms(n); return h }
	tests := []struct {
		name    string
		h       *hist
		relayed int
	}{
		{"relayed under the node's lease", at((&hist{t0: t0}).d("a", "k", 1, 0, 3, 7), 400), 1},
		{"before the lease TTL had passed", at((&hist{t0: t0}).d("a", "k", 1, 0, 3, 7), 200), 0},
		{"after the heal", at((&hist{t0: t0}).d("a", "k", 1, 0, 3, 7), 700), 0},
		{"a partition the node did not hold", at((&hist{t0: t0}).d("a", "k", 1, 0, 4, 7), 400), 0},
		{"under a newer lease: another node's", at((&hist{t0: t0}).d("a", "k", 1, 0, 3, 8), 400), 0},
		{"the cut source", at((&hist{t0: t0}).in("billing").d("a", "k", 1, 0, 3, 7), 400), 0},
		{"a redelivery to the checker", at(at((&hist{t0: t0}).d("a", "k", 1, 0, 3, 7), 250).again(0, true), 400), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := checkHistory(tc.h.ds, nil, nil, window(), []string{"default", "billing"})
			checkIsolation(t, v, tc.relayed, tc.relayed == 0)
		})
	}
	// The leases read at the heal: every one kept passes, one lost fails
	// even with messages relayed, and an unknown count (-1) judges nothing.
	for _, kept := range []int{2, 1, -1} {
		w := window()
		w[1].Isolation.Kept = kept
		v := checkHistory(at((&hist{t0: t0}).d("a", "k", 1, 0, 3, 7), 400).ds, nil, nil, w, []string{"default", "billing"})
		t.Run(fmt.Sprintf("kept %d of 2", kept), func(t *testing.T) { checkIsolation(t, v, 1, kept == 1) })
	}
}

// checkIsolation checks step 1's isolation verdict.
func checkIsolation(t *testing.T, v historyVerdict, relayed int, stalled bool) {
	t.Helper()
	if v.Steps[1].Relayed != relayed {
		t.Fatalf("relayed %d, want %d", v.Steps[1].Relayed, relayed)
	}
	if v.Steps[1].Stalled != stalled || (v.Isolation == 1) != stalled || v.OK() == stalled {
		t.Fatalf("stalled %v, isolation failures %d, OK %v; want stalled %v", v.Steps[1].Stalled, v.Isolation, v.OK(), stalled)
	}
	if stalled && (len(v.Problems) == 0 || !strings.Contains(v.Problems[0], "isolation: step 1")) {
		t.Fatalf("problems %q, want the isolation named", v.Problems)
	}
}

func TestHeldEpochs(t *testing.T) {
	srcs := []node.SourceStatus{
		{Name: "default", Held: []int{0, 2}, Leases: []node.PartitionStatus{{Partition: 0, Owner: "n1", Epoch: 4}, {Partition: 2, Owner: "n1", Epoch: 9}}},
		{Name: "billing", Held: []int{1, 2}, Leases: []node.PartitionStatus{
			{Partition: 0, Owner: "n2", Epoch: 1}, {Partition: 1, Owner: "n1", Epoch: 3}, {Partition: 2, Owner: "n3", Epoch: 5}}},
	}
	got := heldEpochs(srcs, "billing", "n1")
	if want := map[int]int64{1: 3}; !reflect.DeepEqual(got, want) {
		t.Fatalf("heldEpochs = %v, want %v (held by n1 and leased to it)", got, want)
	}
	if got := heldEpochs(srcs, "ledger", "n1"); len(got) != 0 {
		t.Fatalf("an unknown source gave %v", got)
	}
}

func TestNodeSourceEnv(t *testing.T) {
	one := []*runDB{{name: "default"}}
	if got := nodeSourceEnv(one, []string{"postgres://a/x"}); got != "ORDO_POSTGRES_URL=postgres://a/x" {
		t.Fatalf("one source: %q", got)
	}
	two := []*runDB{{name: "default"}, {name: "billing"}}
	if got := nodeSourceEnv(two, []string{"postgres://a/x", "postgres://b/y"}); got != "ORDO_SOURCES=default=postgres://a/x billing=postgres://b/y" {
		t.Fatalf("two sources: %q", got)
	}
}

// TestPlanTwoSourcesRunsEveryKindOnce: with two sources the short plan
// has source-link too, and stays under 2 minutes of faults; with one it
// has exactly the kinds it had before sources.
func TestPlanTwoSourcesRunsEveryKindOnce(t *testing.T) {
	two := Config{Scenario: ScenarioRelay}
	one := Config{Scenario: ScenarioRelay, Sources: 1}
	if !slices.Contains(two.scenarioKinds(), kindSourceLink) || slices.Contains(one.scenarioKinds(), kindSourceLink) {
		t.Fatalf("kinds: two sources %v, one %v", two.scenarioKinds(), one.scenarioKinds())
	}
	for seed := int64(1); seed <= 50; seed++ {
		plan, err := planKinds(seed, ProfileShort, 3, two.scenarioKinds())
		if err != nil {
			t.Fatal(err)
		}
		kinds, total := checkShortPlan(t, seed, plan)
		want := slices.Clone(two.scenarioKinds())
		slices.Sort(want)
		if !slices.Equal(kinds, want) {
			t.Fatalf("seed %d: kinds %v, want every kind once", seed, kinds)
		}
		if total < time.Minute || total > 2*time.Minute {
			t.Fatalf("seed %d: the two-source short plan is estimated at %v, want 1-2 minutes of faults", seed, total)
		}
		for _, s := range plan {
			if s.Kind == kindSourceLink && (s.Source < 0 || s.Source >= len(sourceNames) || s.Hold < sourceLinkWatchFrom+2*time.Second) {
				t.Fatalf("seed %d: %+v: source out of range or hold too short for the check", seed, s)
			}
		}
		p1, _ := planKinds(seed, ProfileShort, 3, one.scenarioKinds())
		p0, _ := planSchedule(seed, ProfileShort, 3)
		if !reflect.DeepEqual(p1, p0) {
			t.Fatalf("seed %d: the one-source plan changed", seed)
		}
	}
}

func TestValidateSources(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		ok   bool
		want int
	}{
		{Config{Scenario: ScenarioRelay}, true, 2},
		{Config{Scenario: ScenarioRelay, Sources: 1}, true, 1},
		{Config{Scenario: ScenarioRelay, Sources: 3}, false, 0},
		{Config{Scenario: ScenarioRelay, Sources: -1}, false, 0},
		{Config{Scenario: ScenarioConsumers}, true, 1},
		{Config{Scenario: ScenarioConsumers, Sources: 2}, false, 0},
		{Config{Scenario: ScenarioRelay, Sources: 1, Kinds: []Kind{kindSourceLink}}, false, 0},
		{Config{Scenario: ScenarioRelay, Kinds: []Kind{kindSourceLink}}, true, 2},
	} {
		c := DefaultConfig()
		c.Scenario, c.Sources, c.Kinds = tc.c.Scenario, tc.c.Sources, tc.c.Kinds
		err := c.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v, want ok %v", tc.c, err, tc.ok)
		}
		if tc.ok && c.sourceCount() != tc.want {
			t.Errorf("%+v: %d sources, want %d", tc.c, c.sourceCount(), tc.want)
		}
	}
}
