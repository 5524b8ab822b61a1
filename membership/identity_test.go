package membership

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/internal/testkit"
)

var (
	dbX = DatabaseIdentity(7715566634483763347, 16384)
	dbY = DatabaseIdentity(7715566634483763347, 16385)
	dbZ = DatabaseIdentity(1, 16384)
)

func srcs(pairs ...string) Health {
	var st []SourceState
	for i := 0; i < len(pairs); i += 2 {
		name, reachable := strings.CutPrefix(pairs[i], "!")
		st = append(st, SourceState{Name: name, Reachable: !reachable, Identity: pairs[i+1]})
	}
	return SourcesHealth(true, st)
}

// TestFindConflicts: a peer conflicts with this node on a source when it
// relays the source from another database, or the source's database
// under another name; a peer or a source whose identity is unknown
// conflicts with nothing.
func TestFindConflicts(t *testing.T) {
	orders := srcs("orders", dbX)
	for _, c := range []struct {
		name string
		self Health
		peer Health
		want []Conflict
	}{
		{"same name, same database", orders, srcs("orders", dbX, "billing", dbY), nil},
		{"same name, another database", orders, srcs("billing", dbZ, "orders", dbY),
			[]Conflict{{Source: "orders", Identity: dbX, Peer: "p", PeerSource: "orders", PeerIdentity: dbY}}},
		{"another name, same database", orders, srcs("billing", dbX),
			[]Conflict{{Source: "orders", Identity: dbX, Peer: "p", PeerSource: "billing", PeerIdentity: dbX}}},
		{"another name, another database", orders, srcs("billing", dbY), nil},
		{"cut off from its database, still compared", orders, srcs("!orders", dbY),
			[]Conflict{{Source: "orders", Identity: dbX, Peer: "p", PeerSource: "orders", PeerIdentity: dbY}}},
		{"peer older than identities", orders, Health{Broker: true, Database: true, Sources: "orders"}, nil},
		{"peer's identity unknown", orders, srcs("orders", "", "billing", dbZ), nil},
		{"this node's identity unknown", srcs("orders", ""), srcs("orders", dbY), nil},
		{"one-source form", Health{IDs: dbX}, Health{IDs: dbY},
			[]Conflict{{Source: "default", Identity: dbX, Peer: "p", PeerSource: "default", PeerIdentity: dbY}}},
		{"one-source form against a named default", Health{IDs: dbX}, srcs("default", dbX), nil},
		{"tokens cut short: common prefix, same", orders, Health{Sources: "orders", IDs: dbX[:MinIdentityLen]}, nil},
		{"tokens cut short: common prefix, another", orders, Health{Sources: "orders", IDs: dbY[:MinIdentityLen]},
			[]Conflict{{Source: "orders", Identity: dbX, Peer: "p", PeerSource: "orders", PeerIdentity: dbY[:MinIdentityLen]}}},
		{"tokens too short: unknown", orders, Health{Sources: "orders", IDs: dbY[:MinIdentityLen-1]}, nil},
		{"tokens of uneven width: unknown", orders, Health{Sources: "orders billing", IDs: dbY + "abc"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := findConflicts(c.self, map[string]Health{"p": c.peer})
			if !slices.Equal(got, c.want) {
				t.Fatalf("conflicts %+v, want %+v", got, c.want)
			}
			for _, x := range got {
				if s := x.String(); !strings.Contains(s, x.Peer) || !strings.Contains(s, x.Source) || !strings.Contains(s, x.PeerSource) {
					t.Fatalf("%q does not name the peer and both sources", s)
				}
			}
		})
	}
	if dbX == dbY || dbX == dbZ || len(dbX) != IdentityLen {
		t.Fatalf("tokens %q %q %q", dbX, dbY, dbZ)
	}
}

// TestMetaIdentityFits: the metadata of the most sources a node relays
// (12) with the longest names, every one cut off, stays within
// memberlist's 512 bytes with a token of MinIdentityLen or more each; 12
// names of 28 bytes keep whole tokens. A node older than identities reads
// the new metadata as before (the id field is one it does not know).
func TestMetaIdentityFits(t *testing.T) {
	const maxSources = 12 // node.MaxSources
	worst := func(nameLen int) Health {
		var pairs []string
		for i := range maxSources {
			name := strings.Repeat(string(rune('a'+i)), nameLen)
			pairs = append(pairs, "!"+name, DatabaseIdentity(1, uint32(i)))
		}
		h := srcs(pairs...)
		h.Broker = false
		return h
	}
	for _, c := range []struct {
		nameLen, width int
	}{{32, MinIdentityLen}, {29, 7}, {28, IdentityLen}, {1, IdentityLen}} {
		h := worst(c.nameLen)
		b := encodeMeta(h)
		if len(b) > 512 {
			t.Fatalf("names of %d bytes: metadata of %d bytes, memberlist allows 512", c.nameLen, len(b))
		}
		got := decodeMeta(b)
		if w := len(got.IDs) / maxSources; w != c.width || got.Sources != h.Sources || got.Broker || got.Database {
			t.Fatalf("names of %d bytes: decoded %+v (token width %d), want width %d", c.nameLen, got, w, c.width)
		}
		if cs := findConflicts(h, map[string]Health{"p": got}); len(cs) != 0 {
			t.Fatalf("names of %d bytes: cut tokens conflict with whole ones: %+v", c.nameLen, cs)
		}
		t.Logf("12 names of %d bytes, all cut off: %d bytes of metadata, tokens of %d characters", c.nameLen, len(b), c.width)
	}
	var old struct { // nodeMeta before identities
		V        int    `json:"v"`
		Broker   bool   `json:"broker"`
		Database bool   `json:"db"`
		Sources  string `json:"src"`
	}
	h := srcs("orders", dbX, "!billing", dbY)
	if err := json.Unmarshal(encodeMeta(h), &old); err != nil || old.V != metaVersion || old.Sources != h.Sources || !old.Broker || old.Database {
		t.Fatalf("an older node reads %+v (%v) from %+v", old, err, h)
	}
}

// startWith starts a member that says h of itself from the start.
func startWith(t *testing.T, cfg Config, h Health) *running {
	t.Helper()
	return startAfter(t, cfg, func(m *Membership) { m.SetHealth(h) })
}

// exited waits for r's Run to return by itself, and returns its error.
func (r *running) exited(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		close(r.done)
		return err
	case <-time.After(timeout):
		t.Fatalf("%s still runs after %v", r.m.cfg.NodeName, timeout)
		return nil
	}
}

func idConfig(name, bind string, join []string, sources ...string) Config {
	c := testConfig(name, bind)
	c.Join, c.Sources, c.HealthHold = join, sources, 100*time.Millisecond
	return c
}

func waitEligibleFor(t *testing.T, r *running, source string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(r.m.EligibleFor(source), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s sees %v eligible for %s, want %v; members %+v", r.m.cfg.NodeName, r.m.EligibleFor(source), source, want, r.m.Members())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitGossips waits until r sees member gossip id for source: member
// has passed its join's check.
func waitGossips(t *testing.T, r *running, member, source, id string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, r.m.cfg.NodeName+" sees "+member+" gossip "+source+"'s identity", func() bool {
		for _, x := range r.m.Members() {
			if x.Name == member && x.Health.Identity(source) == id {
				return true
			}
		}
		return false
	})
}

// TestIdentityConflictAtJoin: a node joining with another database under
// a source's name stops with a *ConflictError naming the peer, before it
// counts itself joined; the running node sees no conflict (the joiner
// never gossiped its identity) and keeps the source. A node older than
// identities conflicts with nobody.
func TestIdentityConflictAtJoin(t *testing.T) {
	seed := testkit.FreeAddr(t)
	a := startWith(t, idConfig("a", seed, nil, "orders"), srcs("orders", dbX))
	waitEligibleFor(t, a, "orders", "a")

	b := startWith(t, idConfig("b", testkit.FreeAddr(t), []string{seed}, "orders"), srcs("orders", dbY))
	err := b.exited(t, 10*time.Second)
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrIdentityConflict) || len(ce.Conflicts) != 1 ||
		ce.Conflicts[0] != (Conflict{Source: "orders", Identity: dbY, Peer: "a", PeerSource: "orders", PeerIdentity: dbX}) {
		t.Fatalf("b's Run: %v, want a *ConflictError on orders with a", err)
	}
	if b.m.Joined() {
		t.Fatal("b counts itself joined")
	}
	t.Logf("b refused: %v", err)
	if cs := a.m.Conflicts(); len(cs) != 0 {
		t.Fatalf("a sees conflicts %+v", cs)
	}

	old := startWith(t, idConfig("old", testkit.FreeAddr(t), []string{seed}, "orders"), srcs("orders", ""))
	waitEligibleFor(t, a, "orders", "a", "old")
	waitEligibleFor(t, old, "orders", "a", "old")
	if cs := append(a.m.Conflicts(), old.m.Conflicts()...); len(cs) != 0 {
		t.Fatalf("conflicts with a node that gossips no identity: %+v", cs)
	}
}

// TestIdentityConflictLater: two nodes that passed the join's check and
// then disagree (here b says another database for orders, as two nodes
// started together do) each leave the other out of orders' map, and say
// so in Conflicts; both keep running; when they agree again both are
// eligible again.
func TestIdentityConflictLater(t *testing.T) {
	seed := testkit.FreeAddr(t)
	a := startWith(t, idConfig("a", seed, nil, "orders"), srcs("orders", dbX))
	waitEligibleFor(t, a, "orders", "a")
	b := startWith(t, idConfig("b", testkit.FreeAddr(t), []string{seed}, "orders"), srcs("orders", dbX))
	waitEligibleFor(t, a, "orders", "a", "b")
	waitEligibleFor(t, b, "orders", "a", "b")
	waitGossips(t, a, "b", "orders", dbX)

	b.m.SetHealth(srcs("orders", dbY))
	waitEligibleFor(t, a, "orders", "a")
	waitEligibleFor(t, b, "orders", "b")
	want := Conflict{Source: "orders", Identity: dbX, Peer: "b", PeerSource: "orders", PeerIdentity: dbY}
	if cs := a.m.Conflicts(); len(cs) != 1 || cs[0] != want {
		t.Fatalf("a's conflicts %+v, want %+v", cs, want)
	}
	if cs := b.m.Conflicts(); len(cs) != 1 || cs[0].Peer != "a" {
		t.Fatalf("b's conflicts %+v", cs)
	}
	b.m.SetHealth(srcs("orders", dbX))
	waitEligibleFor(t, a, "orders", "a", "b")
	waitEligibleFor(t, b, "orders", "a", "b")
	if cs := append(a.m.Conflicts(), b.m.Conflicts()...); len(cs) != 0 {
		t.Fatalf("conflicts after agreeing again: %+v", cs)
	}
	for _, r := range []*running{a, b} {
		select {
		case err := <-r.done:
			t.Fatalf("%s stopped: %v", r.m.cfg.NodeName, err)
		default:
		}
	}
}

// TestIdentityLateSource: a source listed after the join (its database
// answered late) is checked then: a conflict stops the node, and until
// the check passes the node counts itself out of that source's map, as
// its peers do.
func TestIdentityLateSource(t *testing.T) {
	seed := testkit.FreeAddr(t)
	a := startWith(t, idConfig("a", seed, nil, "orders", "billing"), srcs("orders", dbX, "billing", dbZ))
	waitEligibleFor(t, a, "billing", "a")
	b := startWith(t, idConfig("b", testkit.FreeAddr(t), []string{seed}, "orders", "billing"), srcs("orders", dbX))
	c := startWith(t, idConfig("c", testkit.FreeAddr(t), []string{seed}, "orders", "billing"), srcs("orders", dbX))
	waitEligibleFor(t, a, "orders", "a", "b", "c")
	waitGossips(t, a, "b", "orders", dbX)
	waitGossips(t, a, "c", "orders", dbX)

	c.m.SetHealth(srcs("orders", dbX, "billing", dbZ))
	waitEligibleFor(t, a, "billing", "a", "c")
	waitEligibleFor(t, c, "billing", "a", "c")

	waitGossips(t, b, "c", "billing", dbZ)
	b.m.SetHealth(srcs("orders", dbX, "billing", dbY))
	err := b.exited(t, 10*time.Second)
	if slices.Contains(b.m.EligibleFor("billing"), "b") {
		t.Fatalf("b counts itself eligible for billing, not checked: %v", b.m.EligibleFor("billing"))
	}
	var ce *ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 2 || ce.Conflicts[0].Peer != "a" || ce.Conflicts[1].Peer != "c" ||
		ce.Conflicts[0].Source != "billing" || ce.Conflicts[0].PeerIdentity != dbZ {
		t.Fatalf("b's Run: %v, want a *ConflictError on billing with a and c", err)
	}
	t.Logf("b refused billing: %v", err)
}

// TestIdentityNotGossipedBeforeCheck: a node gossips no identity before
// the join's check (so that two nodes joining together do not refuse
// each other), and the identity once it has passed.
func TestIdentityNotGossipedBeforeCheck(t *testing.T) {
	cfg := idConfig("a", testkit.FreeAddr(t), nil, "orders")
	cfg.Logger = testkit.Logger(t, slog.LevelWarn)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetHealth(srcs("orders", dbX))
	if got := decodeMeta(m.meta.Load().([]byte)); got.IDs != "" || got.Sources != "orders" {
		t.Fatalf("before the check: gossips %+v, want orders and no identity", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, 10*time.Second, "a gossips orders' identity", func() bool {
		return decodeMeta(m.meta.Load().([]byte)).Identity("orders") == dbX
	})
}

// TestIdentityJoinBesideConflict: while two running nodes disagree on
// orders, a node joining with the database of one of them joins (a
// peer agrees with it) and leaves the other out of its map, as its
// side does; a node joining with a third database refuses.
func TestIdentityJoinBesideConflict(t *testing.T) {
	seed := testkit.FreeAddr(t)
	a := startWith(t, idConfig("a", seed, nil, "orders"), srcs("orders", dbX))
	waitEligibleFor(t, a, "orders", "a")
	b := startWith(t, idConfig("b", testkit.FreeAddr(t), []string{seed}, "orders"), srcs("orders", dbX))
	waitGossips(t, a, "b", "orders", dbX)
	b.m.SetHealth(srcs("orders", dbY))
	waitEligibleFor(t, a, "orders", "a")

	c := startWith(t, idConfig("c", testkit.FreeAddr(t), []string{seed}, "orders"), srcs("orders", dbX))
	waitEligibleFor(t, c, "orders", "a", "c")
	waitEligibleFor(t, a, "orders", "a", "c")
	waitEligibleFor(t, b, "orders", "b")
	if cs := c.m.Conflicts(); len(cs) != 1 || cs[0].Peer != "b" {
		t.Fatalf("c's conflicts %+v, want one with b", cs)
	}

	waitGossips(t, a, "c", "orders", dbX)
	d := startWith(t, idConfig("d", testkit.FreeAddr(t), []string{seed}, "orders"), srcs("orders", dbZ))
	var ce *ConflictError
	if err := d.exited(t, 10*time.Second); !errors.As(err, &ce) || len(ce.Conflicts) != 3 {
		t.Fatalf("d's Run: %v, want a *ConflictError with a, b and c", err)
	}
	select {
	case err := <-c.done:
		t.Fatalf("c stopped: %v", err)
	default:
	}
}
