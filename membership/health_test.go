package membership

import (
	"slices"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

func TestEligibility(t *testing.T) {
	t0 := time.Unix(1000, 0)
	down := Health{Broker: false, Database: true}
	type step struct {
		at     time.Duration
		health map[string]Health
		want   []string
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"all healthy", []step{{0, map[string]Health{"a": Healthy, "b": Healthy}, []string{"a", "b"}}}},
		{"one down steps aside after the hold", []step{
			{0, map[string]Health{"a": Healthy, "b": down}, []string{"a", "b"}},
			{999 * time.Millisecond, map[string]Health{"a": Healthy, "b": down}, []string{"a", "b"}},
			{time.Second, map[string]Health{"a": Healthy, "b": down}, []string{"a"}},
			{2 * time.Second, map[string]Health{"a": Healthy, "b": Healthy}, []string{"a", "b"}},
		}},
		{"down for everyone, noticed apart: nobody steps aside", []step{
			{0, map[string]Health{"a": down, "b": Healthy, "c": Healthy}, []string{"a", "b", "c"}},
			{300 * time.Millisecond, map[string]Health{"a": down, "b": down, "c": Healthy}, []string{"a", "b", "c"}},
			{600 * time.Millisecond, map[string]Health{"a": down, "b": down, "c": down}, []string{"a", "b", "c"}},
			{5 * time.Second, map[string]Health{"a": down, "b": down, "c": down}, []string{"a", "b", "c"}},
		}},
		{"back for everyone, noticed apart: nobody steps aside", []step{
			{0, map[string]Health{"a": down, "b": down}, []string{"a", "b"}},
			{time.Second, map[string]Health{"a": Healthy, "b": down}, []string{"a", "b"}},
			{1500 * time.Millisecond, map[string]Health{"a": Healthy, "b": Healthy}, []string{"a", "b"}},
		}},
		{"a flap shorter than the hold moves nothing", []step{
			{0, map[string]Health{"a": Healthy, "b": down}, []string{"a", "b"}},
			{500 * time.Millisecond, map[string]Health{"a": Healthy, "b": Healthy}, []string{"a", "b"}},
			{900 * time.Millisecond, map[string]Health{"a": Healthy, "b": down}, []string{"a", "b"}},
			{1800 * time.Millisecond, map[string]Health{"a": Healthy, "b": down}, []string{"a", "b"}},
			{1900 * time.Millisecond, map[string]Health{"a": Healthy, "b": down}, []string{"a"}},
		}},
		{"the less unhealthy stay", []step{
			{0, map[string]Health{"a": {}, "b": down, "c": {Database: false, Broker: true}}, []string{"a", "b", "c"}},
			{time.Second, map[string]Health{"a": {}, "b": down, "c": {Database: false, Broker: true}}, []string{"b", "c"}},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := eligibility{hold: time.Second}
			for _, s := range c.steps {
				got, recheck := e.update(t0.Add(s.at), s.health)
				if !slices.Equal(got, s.want) {
					t.Fatalf("at %v: eligible %v, want %v", s.at, got, s.want)
				}
				if !recheck.IsZero() && !recheck.After(t0.Add(s.at)) {
					t.Fatalf("at %v: recheck at %v, not later", s.at, recheck.Sub(t0))
				}
			}
		})
	}
}

func TestMetaEncoding(t *testing.T) {
	for _, h := range []Health{Healthy, {}, {Broker: true}, {Database: true}} {
		b := encodeMeta(h)
		if len(b) > 512 {
			t.Fatalf("metadata of %d bytes, memberlist allows 512", len(b))
		}
		if got := decodeMeta(b); got != h {
			t.Fatalf("decode(encode(%+v)) = %+v", h, got)
		}
	}
	for _, b := range [][]byte{nil, []byte("{"), []byte(`{"v":2,"broker":false}`)} {
		if got := decodeMeta(b); got != Healthy {
			t.Fatalf("decode(%q) = %+v, want Healthy (unknown counts as healthy)", b, got)
		}
	}
}

// TestHealthGossiped: a node's health reaches its peers through memberlist
// metadata; a node less healthy than its peers leaves their eligible set
// after the hold and comes back when healthy; when every node is down
// alike, all stay eligible.
func TestHealthGossiped(t *testing.T) {
	addrs := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	var nodes []*running
	for i, name := range []string{"a", "b", "c"} {
		cfg := testConfig(name, addrs[i])
		cfg.Join = addrs[:1]
		cfg.HealthHold = 300 * time.Millisecond
		nodes = append(nodes, start(t, cfg))
	}
	all := []string{"a", "b", "c"}
	for _, n := range nodes {
		waitAlive(t, n, all, 10*time.Second)
	}
	waitEligible := func(want []string) {
		t.Helper()
		for _, n := range nodes {
			deadline := time.Now().Add(10 * time.Second)
			for !slices.Equal(n.m.Eligible(), want) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: eligible %v, want %v (members %+v)", n.m.cfg.NodeName, n.m.Eligible(), want, n.m.Members())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	brokerDown := Health{Database: true}
	start := time.Now()
	nodes[2].m.SetHealth(brokerDown)
	waitEligible([]string{"a", "b"})
	t.Logf("c out of every eligible set %v after its broker went down (hold 300ms)", time.Since(start).Round(time.Millisecond))
	nodes[2].m.SetHealth(Healthy)
	waitEligible(all)
	for _, n := range nodes {
		n.m.SetHealth(brokerDown)
	}
	waitEligible(all)
	time.Sleep(600 * time.Millisecond) // past the hold: still nobody out
	waitEligible(all)
	for _, n := range nodes {
		if got := n.m.Members(); len(got) != 3 || got[0].Health != brokerDown {
			t.Fatalf("%s's members: %+v", n.m.cfg.NodeName, got)
		}
	}
}

// TestHealthForSource: a member's health for one source is its broker
// and that source's database; a member that lists no sources relays
// default only; a member cut off from billing steps aside for billing
// only, and one that does not relay billing is never eligible for it.
func TestHealthForSource(t *testing.T) {
	cut := SourcesHealth(true, []SourceState{{Name: "default", Reachable: true}, {Name: "billing"}})
	if cut.Sources != "default !billing" || cut.Database {
		t.Fatalf("SourcesHealth = %+v", cut)
	}
	both := SourcesHealth(true, []SourceState{{Name: "default", Reachable: true}, {Name: "billing", Reachable: true}})
	for _, c := range []struct {
		name   string
		h      Health
		source string
		want   Health
		ok     bool
	}{
		{"cut from billing, for billing", cut, "billing", Health{Broker: true}, true},
		{"cut from billing, for default", cut, "default", Healthy, true},
		{"no sources, for default", Health{Broker: true}, "default", Health{Broker: true}, true},
		{"no sources, for billing", Healthy, "billing", Health{}, false},
		{"not listed", both, "orders", Health{}, false},
	} {
		got, ok := c.h.For(c.source)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("%s: For(%s) = %+v, %v; want %+v, %v", c.name, c.source, got, ok, c.want, c.ok)
		}
	}
	t0 := time.Unix(1000, 0)
	members := map[string]Health{"a": both, "b": both, "c": cut, "old": Healthy}
	for source, want := range map[string][]string{"default": {"a", "b", "c", "old"}, "billing": {"a", "b"}} {
		e := eligibility{hold: time.Second}
		e.update(t0, healthFor(members, source))
		if got, _ := e.update(t0.Add(time.Second), healthFor(members, source)); !slices.Equal(got, want) {
			t.Errorf("eligible for %s: %v, want %v", source, got, want)
		}
	}
	if b := encodeMeta(cut); len(b) > 512 {
		t.Errorf("metadata of %d bytes", len(b))
	}
	if got := decodeMeta(encodeMeta(cut)); got != cut {
		t.Errorf("metadata round trip: %+v, want %+v", got, cut)
	}
}
