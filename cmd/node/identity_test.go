package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/node"
)

// databaseToken returns the identity token nodes gossip for the
// database at dbURL (membership.DatabaseIdentity).
func databaseToken(t *testing.T, ob *testkit.Outbox) string {
	t.Helper()
	var sysid, oid int64
	err := ob.Pool.QueryRow(ctx30(t), `SELECT (SELECT system_identifier FROM pg_control_system()),
       (SELECT oid::int8 FROM pg_database WHERE datname = current_database())`).Scan(&sysid, &oid)
	if err != nil {
		t.Fatal(err)
	}
	return membership.DatabaseIdentity(uint64(sysid), uint32(oid))
}

// TestClusterIdentityConflictRefused: n1 relays database X as default.
// A node joining it with default on another database Y, and one joining
// with X under the name billing, each exit 1 naming n1, both sources
// and both identities, having claimed nothing; n1 keeps every partition
// and sees no conflict (they never gossiped an identity). A node reaching
// X by another host name joins, and takes its share.
func TestClusterIdentityConflictRefused(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 8
	x, y := testkit.NewOutbox(t, partitions, 2), testkit.NewOutbox(t, partitions, 2)
	tokX, tokY := databaseToken(t, x), databaseToken(t, y)
	xViaLocalhost := strings.Replace(x.URL, "127.0.0.1", "localhost", 1)
	if xViaLocalhost == x.URL {
		t.Fatalf("test database URL %q does not name 127.0.0.1", x.URL)
	}
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	seed := testkit.FreeAddr(t)
	env := func(name, gossip, db string) []string {
		return []string{db, "ORDO_AMQP_URL=" + testkit.AMQPURL(), "ORDO_NODE_NAME=" + name,
			"ORDO_HTTP_ADDR=" + testkit.FreeAddr(t), "ORDO_GOSSIP_ADDR=" + gossip, "ORDO_JOIN=" + seed,
			"ORDO_GOSSIP_KEY=" + testGossipKey, "ORDO_REJOIN_INTERVAL=1s", "ORDO_POLL_INTERVAL=200ms",
			"ORDO_DB_MAX_CONNS=3", "ORDO_PARTITIONS=" + fmt.Sprint(partitions)}
	}
	n1env := env("n1", seed, "ORDO_POSTGRES_URL="+x.URL)
	n1 := testkit.StartProcess(t, "n1", bin, nil, n1env)
	if err := n1.AwaitOutput("node started", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	c := &cluster{http: []string{strings.TrimPrefix(n1env[3], "ORDO_HTTP_ADDR=")}}
	held := func() int {
		st, ok := c.status(t, 0)
		if !ok {
			return -1
		}
		return len(st.Held)
	}
	testkit.WaitFor(t, 30*time.Second, "n1 holds every partition", func() bool { return held() == partitions })

	for _, tc := range []struct {
		name, db string
		want     []string
	}{
		{"another database under default", "ORDO_POSTGRES_URL=" + y.URL,
			[]string{"source default: node n1 relays it from another database", "its identity " + tokX, "this node's " + tokY}},
		{"default's database as billing", "ORDO_SOURCES=billing=" + xViaLocalhost,
			[]string{"source billing: node n1 relays the same database (identity " + tokX + ") as its source default"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testkit.StartProcess(t, "n2", bin, nil, env("n2", testkit.FreeAddr(t), tc.db))
			code, err := p.Wait(60 * time.Second)
			if err != nil || code != 1 {
				t.Fatalf("exit %d (%v), want 1; output:\n%s", code, err, p.Tail(30))
			}
			out := p.Output()
			for _, w := range append(tc.want, membership.ErrIdentityConflict.Error()) {
				if !strings.Contains(out, w) {
					t.Fatalf("output does not say %q:\n%s", w, p.Tail(30))
				}
			}
			if strings.Contains(out, "leases claimed") {
				t.Fatalf("n2 claimed partitions before refusing:\n%s", p.Tail(30))
			}
			t.Logf("refused: %s", linesWith(out, "refused to join"))
		})
	}
	st, ok := c.status(t, 0)
	if !ok || len(st.Held) != partitions || len(st.IdentityConflicts) != 0 {
		t.Fatalf("n1 after the refusals: ok %v, held %v, conflicts %+v", ok, st.Held, st.IdentityConflicts)
	}

	n3 := testkit.StartProcess(t, "n3", bin, nil, env("n3", testkit.FreeAddr(t), "ORDO_POSTGRES_URL="+xViaLocalhost))
	if err := n3.AwaitOutput("node started", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 60*time.Second, "n1 hands half its partitions to n3, which reaches X as localhost", func() bool {
		return held() == partitions/2
	})
	if n3.Exited() {
		t.Fatalf("n3 exited:\n%s", n3.Tail(30))
	}
}

// sourceGauge returns a per-source family's value for source, -1 when
// absent.
func sourceGauge(fams map[string]*dto.MetricFamily, name, source string) float64 {
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "source" && l.GetValue() == source {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// TestClusterIdentityConflictLater: n1 relays database X as default,
// n2 database Y as default; each started alone and passed its check.
// n3 (another source) then joins both, and n1 and n2 find each other: a
// conflict seen while running (as after a network split heals, or two
// nodes started together). Each leaves the other out of default's map,
// so each leases every partition of its own database and none is left to
// a node that leases elsewhere; n1's /status, /readyz's degradation and
// ordo_source_identity_conflicts say so; both keep running.
func TestClusterIdentityConflictLater(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions = 8
	x, y, z := testkit.NewOutbox(t, partitions, 2), testkit.NewOutbox(t, partitions, 2), testkit.NewOutbox(t, partitions, 2)
	tokX, tokY := databaseToken(t, x), databaseToken(t, y)
	bin := testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node")
	c := &cluster{names: []string{"n1", "n2", "n3"}, procs: make([]*testkit.Process, 3)}
	for range 3 {
		c.gossip, c.http = append(c.gossip, testkit.FreeAddr(t)), append(c.http, testkit.FreeAddr(t))
	}
	start := func(i int, db string, join ...string) {
		c.procs[i] = testkit.StartProcess(t, c.names[i], bin, nil, []string{db, "ORDO_AMQP_URL=" + testkit.AMQPURL(),
			"ORDO_NODE_NAME=" + c.names[i], "ORDO_HTTP_ADDR=" + c.http[i], "ORDO_GOSSIP_ADDR=" + c.gossip[i],
			"ORDO_JOIN=" + strings.Join(join, ","), "ORDO_GOSSIP_KEY=" + testGossipKey, "ORDO_REJOIN_INTERVAL=1s",
			"ORDO_POLL_INTERVAL=200ms", "ORDO_DB_MAX_CONNS=3", "ORDO_PARTITIONS=" + fmt.Sprint(partitions)})
		if err := c.procs[i].AwaitOutput("node started", 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	held := func(i int) int {
		st, ok := c.status(t, i)
		if !ok {
			return -1
		}
		return len(st.Held)
	}
	start(0, "ORDO_POSTGRES_URL="+x.URL, c.gossip[0])
	start(1, "ORDO_POSTGRES_URL="+y.URL, c.gossip[1])
	testkit.WaitFor(t, 30*time.Second, "n1 and n2, each alone, hold every partition of their database", func() bool {
		return held(0) == partitions && held(1) == partitions
	})
	start(2, "ORDO_SOURCES=other="+z.URL, c.gossip[0], c.gossip[1])
	var st node.Status
	testkit.WaitFor(t, 30*time.Second, "n1 sees n2's conflict on default", func() bool {
		var ok bool
		st, ok = c.status(t, 0)
		return ok && len(st.IdentityConflicts) == 1 && len(st.Members) == 3
	})
	want := membership.Conflict{Source: "default", Identity: tokX, Peer: "n2", PeerSource: "default", PeerIdentity: tokY}
	if st.IdentityConflicts[0] != want || !st.Degradation.Degraded || !strings.Contains(strings.Join(st.Degradation.Reasons, "; "), "node n2 relays it from another database") {
		t.Fatalf("n1's status: conflicts %+v, degradation %+v; want %+v and degraded", st.IdentityConflicts, st.Degradation, want)
	}
	if !strings.Contains(c.procs[0].Output(), "a peer disagrees on a source's database") {
		t.Fatalf("n1 logged no error:\n%s", c.procs[0].Tail(20))
	}
	fams := scrape(t, c.http[0])
	if v := sourceGauge(fams, "ordo_source_identity_conflicts", "default"); v != 1 {
		t.Fatalf("n1's ordo_source_identity_conflicts{source=default} = %v, want 1", v)
	}
	// Each node's map of default is its own alone: it never hands a
	// partition of its database to a node that leases in another.
	for i, name := range []string{"n1", "n2"} {
		st, ok := c.status(t, i)
		if !ok || len(st.Assignment) != partitions || slices.ContainsFunc(st.Assignment, func(o string) bool { return o != name }) {
			t.Fatalf("%s's map of default: %v (status ok %v)", name, st.Assignment, ok)
		}
	}
	testkit.WaitFor(t, 30*time.Second, "n1 and n2 each hold every partition of their database", func() bool {
		return held(0) == partitions && held(1) == partitions
	})
	for _, db := range []struct {
		ob    *testkit.Outbox
		owner string
	}{{x, "n1"}, {y, "n2"}} {
		var others int
		if err := db.ob.Pool.QueryRow(ctx30(t), `SELECT count(*) FROM ordo_lease_audit WHERE node <> $1`, db.owner).Scan(&others); err != nil {
			t.Fatal(err)
		}
		if others != 0 {
			t.Fatalf("%d lease events of other nodes than %s in its database", others, db.owner)
		}
	}
	for i, p := range c.procs {
		if p.Exited() {
			t.Fatalf("%s exited:\n%s", c.names[i], p.Tail(20))
		}
	}
}
