package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	dto "github.com/prometheus/client_model/go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
	"github.com/ordo-relay/ordo/wire"
)

// enqueueKeys commits n messages to source, over keys k0..k(keys-1) in
// turn, each expected by the source's checker.
func (r *sourceRig) enqueueKeys(t *testing.T, source string, n, keys int) {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	for i := range n {
		if err := r.enqueue(ctx, source, fmt.Sprintf("k%d", i%keys)); err != nil {
			t.Fatal(err)
		}
	}
}

// sourceGauge returns the value of the gauge name of source; false when
// it is absent.
func sourceGauge(fams map[string]*dto.MetricFamily, name, source string) (float64, bool) {
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "source" && l.GetValue() == source {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestSourceDownAtStart: a node whose billing database does not answer
// when it starts (its link through a proxy that refuses every
// connection) starts anyway, relays everything committed to default, in
// order, while billing is down, and shows billing as down (/status
// reachable and migrated false, ordo_database_reachable 0); once the
// link opens, billing is migrated and everything committed to it is
// relayed too, per key in order, nothing lost. With the sources migrated
// one after the other before the node starts, the node never starts
// while billing is down.
func TestSourceDownAtStart(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	const partitions, keys = 4, 20
	r := newSourceRig(t, partitions)
	link := testkit.NewProxy(t, testkit.HostPort(t, r.dbs["billing"].URL))
	link.Cut()
	r.enqueueKeys(t, wire.DefaultSource, 100, keys)
	r.enqueueKeys(t, "billing", 100, keys)

	cfg := twoSources(r, link.URL(r.dbs["billing"].URL), "late", partitions)
	cfg.Relay.PollInterval = 200 * time.Millisecond
	cfg.AdminToken = adminToken
	addr, stop := runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelWarn)})
	defer stop()
	r.enqueueKeys(t, wire.DefaultSource, 100, keys)
	r.enqueueKeys(t, "billing", 100, keys)

	rep := r.checkers[wire.DefaultSource].WaitFor(t, 60*time.Second, func(rep testkit.Report) bool { return rep.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("default, while billing is down: %s", rep.Detail())
	}
	t.Logf("default while billing is down: %s", rep)
	st := sourceStatus(addr)
	if b, d := st["billing"], st[wire.DefaultSource]; b.Reachable || b.Migrated || !d.Reachable || !d.Migrated {
		t.Fatalf("/status while billing is down: billing reachable %v migrated %v, default reachable %v migrated %v; want false false true true",
			b.Reachable, b.Migrated, d.Reachable, d.Migrated)
	}
	fams := scrapeMetrics(t, addr)
	if v, ok := sourceGauge(fams, "ordo_database_reachable", "billing"); !ok || v != 0 {
		t.Fatalf("ordo_database_reachable{source=billing} = %v (present %v) while billing is down, want 0", v, ok)
	}
	if rd := readiness(t, addr); rd.Ready || !slices.Contains(rd.Problems, "source billing: database unreachable since start (schema not migrated yet)") {
		t.Fatalf("/readyz while billing is down: %+v, want not ready, naming billing", rd)
	}
	if got := r.checkers["billing"].Report().Distinct; got != 0 {
		t.Fatalf("%d billing messages delivered while its link was refused", got)
	}
	if code := adminStatus(t, addr, "billing"); code != http.StatusServiceUnavailable {
		t.Fatalf("/admin/parked?source=billing while billing is not migrated: %d, want 503", code)
	}

	link.Restore()
	rep = r.checkers["billing"].WaitFor(t, 60*time.Second, func(rep testkit.Report) bool { return rep.Lost == 0 })
	t.Logf("billing once its link opened: %s", rep)
	if !rep.OK() {
		t.Fatalf("billing: %s", rep.Detail())
	}
	testkit.WaitFor(t, 30*time.Second, "billing reachable on /status", func() bool {
		b := sourceStatus(addr)["billing"]
		return b.Reachable && b.Migrated
	})
	if rep := r.checkers[wire.DefaultSource].Report(); !rep.OK() {
		t.Fatalf("default: %s", rep.Detail())
	}
}

// readiness fetches a node's /readyz.
func readiness(t *testing.T, addr string) node.Readiness {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rd node.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		t.Fatal(err)
	}
	return rd
}

// TestSourceFatalAtStart: an error of a source that waiting cannot mend
// stops the node before it starts, with an error that names the source,
// rather than being waited for like a database that does not answer:
// a database that does not exist (SQLSTATE 3D000: its URL is wrong, and
// only a restart changes it), and a partition count mismatch found
// behind a slow link (every reply 100 ms late), well after default is
// migrated: the node waits for every source's first attempt.
func TestSourceFatalAtStart(t *testing.T) {
	t.Parallel()
	r := newSourceRig(t, 2)
	u, err := url.Parse(r.dbs["billing"].URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/ordo_no_such_database"
	slow := testkit.NewProxy(t, testkit.HostPort(t, r.dbs["billing"].URL))
	slow.DelayReplies(100 * time.Millisecond)
	for _, c := range []struct {
		name  string
		url   string
		count int
		is    func(error) bool
	}{
		{"no such database", u.String(), 0, func(err error) bool {
			var pgErr *pgconn.PgError
			return errors.As(err, &pgErr) && pgErr.Code == "3D000"
		}},
		{"mismatch behind a slow link", slow.URL(r.dbs["billing"].URL), 4, func(err error) bool {
			return errors.Is(err, outbox.ErrPartitionMismatch)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := twoSources(r, c.url, "fatal", 2)
			cfg.Sources[1].Partitions = c.count
			err := node.Run(testkit.Context(t, 60*time.Second), cfg, node.Options{Logger: testkit.Logger(t, slog.LevelError),
				Ready: func(string) { t.Error("the node started") }})
			if !c.is(err) || !strings.HasPrefix(err.Error(), "source billing: ") {
				t.Fatalf("Run: %v, want billing's error, naming the source", err)
			}
		})
	}
}

// TestSourceMismatchFoundLateStopsNode: a partition count mismatch of a
// source that was down at start is found when it answers, and stops the
// running node with the error that names the source, as it would have
// at start.
func TestSourceMismatchFoundLateStopsNode(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	r := newSourceRig(t, 4)
	link := testkit.NewProxy(t, testkit.HostPort(t, r.dbs["billing"].URL))
	link.Cut()
	cfg := twoSources(r, link.URL(r.dbs["billing"].URL), "mismatch-late", 4)
	cfg.Sources[1].Partitions = 8 // installed with 4
	ready := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- node.Run(ctx, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelError), Ready: func(string) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the node did not start while billing was down: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("the node did not start within 30 s while billing was down")
	}
	link.Restore()
	select {
	case err := <-done:
		if !errors.Is(err, outbox.ErrPartitionMismatch) {
			t.Fatalf("Run: %v, want the partition mismatch of billing", err)
		}
		if want := "source billing: outbox was installed with 4 partitions but this node is configured with 8"; !strings.Contains(err.Error(), want) {
			t.Fatalf("Run: %v\nwant it to say %q", err, want)
		}
	case <-time.After(60 * time.Second):
		cancel()
		<-done
		t.Fatal("the node kept running for 60 s after billing's mismatch could be found")
	}
}

// TestShutdownWhileSourceConnecting: a node stopped while a source's
// migration is still connecting to a database that does not answer (a
// proxy that holds every byte) returns at once, leaving no goroutine
// (goleak, TestMain): before it started (the one-source form waits for
// its only source) and after (billing still connecting, default relaying).
func TestShutdownWhileSourceConnecting(t *testing.T) {
	t.Parallel()
	testkit.RequireRabbitMQ(t)
	r := newSourceRig(t, 2)
	link := testkit.NewProxy(t, testkit.HostPort(t, r.dbs["billing"].URL))
	link.Stall()
	defer link.Resume()

	t.Run("before start", func(t *testing.T) {
		cfg := twoSources(r, "", "stall-one", 2)
		cfg.Sources, cfg.PostgresURL = nil, link.URL(r.dbs["billing"].URL)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- node.Run(ctx, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelError)}) }()
		select {
		case err := <-done:
			t.Fatalf("Run returned while its only source did not answer: %v", err)
		case <-time.After(time.Second):
		}
		stopped := time.Now()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run, stopped before it started: %v, want nil", err)
		}
		if d := time.Since(stopped); d > 2*time.Second {
			t.Fatalf("Run took %v to return after its context ended", d)
		}
	})
	t.Run("running", func(t *testing.T) {
		cfg := twoSources(r, link.URL(r.dbs["billing"].URL), "stall-two", 2)
		addr, stop := runNode(t, cfg, node.Options{Logger: testkit.Logger(t, slog.LevelError)})
		var st map[string]node.SourceStatus
		testkit.WaitFor(t, 30*time.Second, "default reachable on /status", func() bool {
			st = sourceStatus(addr)
			return st[wire.DefaultSource].Reachable
		})
		if b := st["billing"]; b.Migrated || b.Reachable {
			t.Fatalf("/status: billing migrated %v, reachable %v while it does not answer; want false", b.Migrated, b.Reachable)
		}
		stopped := time.Now()
		stop()
		if d := time.Since(stopped); d > 5*time.Second {
			t.Fatalf("the node took %v to stop while billing was connecting", d)
		}
	})
}

// migrationLockKey is pgmigrate's advisory lock key ('ordo.mig' in
// ASCII), held by every migration of a database while it runs.
const migrationLockKey int64 = 0x6f72646f2e6d6967

// TestSourceNotMigratedLeftOutOfMap: a node whose billing migration
// cannot finish (another session holds the migration lock: its database
// answers pings, but its leaser cannot start) says billing unreachable,
// so the cluster leaves it out of billing's map: its peer keeps every
// billing partition and relays every billing message, while the node
// takes its share of default. Once the lock is released it migrates and
// takes its billing share. A node that said billing reachable would be
// given billing partitions it never claims, and their messages would
// wait.
func TestSourceNotMigratedLeftOutOfMap(t *testing.T) {
	testkit.RequireRabbitMQ(t) // not parallel: two nodes with gossip
	const partitions, keys = 4, 20
	r := newSourceRig(t, partitions)
	gossip := []string{testkit.FreeAddr(t), testkit.FreeAddr(t)}
	cfgs := make([]node.Config, 2)
	addrs := make([]string, 2)
	for i, name := range []string{"m1", "m2"} {
		cfgs[i] = twoSources(r, r.dbs["billing"].URL, name, partitions)
		cfgs[i].Gossip.BindAddr, cfgs[i].Gossip.Join, cfgs[i].Gossip.RejoinInterval = gossip[i], gossip, time.Second
		cfgs[i].Gossip.Insecure = true
		cfgs[i].LeaseTTL = 5 * time.Second
		cfgs[i].Relay.PollInterval = 200 * time.Millisecond
	}
	held := func(i int, source string) int { return len(sourceStatus(addrs[i])[source].Held) }
	var stop func()
	addrs[1], stop = runNode(t, cfgs[1], node.Options{Logger: testkit.Logger(t, slog.LevelWarn).With("node", "m2")})
	defer stop()
	testkit.WaitFor(t, 60*time.Second, "m2 alone holds every partition", func() bool {
		return held(1, wire.DefaultSource) == partitions && held(1, "billing") == partitions
	})

	lock, err := r.dbs["billing"].Pool.Acquire(testkit.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(testkit.Context(t, 10*time.Second), `SELECT pg_advisory_lock($1)`, migrationLockKey); err != nil {
		t.Fatal(err)
	}
	least := watchLeast(addrs[1], "billing", partitions)
	addrs[0], stop = runNode(t, cfgs[0], node.Options{Logger: testkit.Logger(t, slog.LevelWarn).With("node", "m1")})
	defer stop()
	testkit.WaitFor(t, 60*time.Second, "m1 holds its share of default", func() bool { return held(0, wire.DefaultSource) == partitions/2 })
	if b := sourceStatus(addrs[0])["billing"]; b.Migrated || b.Reachable {
		t.Fatalf("m1's /status: billing migrated %v, reachable %v while its migration waits; want false", b.Migrated, b.Reachable)
	}
	r.enqueueKeys(t, "billing", 100, keys)
	rep := r.checkers["billing"].WaitFor(t, 30*time.Second, func(rep testkit.Report) bool { return rep.Lost == 0 })
	if !rep.OK() {
		t.Fatalf("billing while m1 cannot migrate it: %s", rep.Detail())
	}
	// m2 keeps every billing partition the whole time, not only at the
	// end: advertised as unreachable rather than left out, m1 was given
	// half of billing for the health hold (LeaseTTL/2, 2.5 s here) and
	// nobody claimed it.
	if n := least(); n != partitions {
		t.Fatalf("m2 held as few as %d billing partitions while m1 could not migrate billing, want all %d throughout", n, partitions)
	}

	if _, err := lock.Exec(testkit.Context(t, 10*time.Second), `SELECT pg_advisory_unlock($1)`, migrationLockKey); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 60*time.Second, "m1 takes its billing share once migrated", func() bool { return held(0, "billing") == partitions/2 })
	r.enqueueKeys(t, "billing", 100, keys)
	rep = r.checkers["billing"].WaitFor(t, 30*time.Second, func(rep testkit.Report) bool { return rep.Lost == 0 })
	t.Logf("billing: %s", rep)
	if !rep.OK() {
		t.Fatalf("billing: %s", rep.Detail())
	}
}

// watchLeast polls the node at httpAddr every 20 ms for how many of
// source's partitions it holds, from now until the returned func is
// called, which stops the polling and returns the fewest seen (start if
// none was read).
func watchLeast(httpAddr, source string, start int) func() int {
	stop, least := make(chan struct{}), make(chan int, 1)
	go func() {
		low := start
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				least <- low
				return
			case <-tick.C:
				if st := sourceStatus(httpAddr); st != nil {
					low = min(low, len(st[source].Held))
				}
			}
		}
	}()
	return func() int { close(stop); return <-least }
}

// adminStatus returns the status code of GET /admin/parked?source=name.
// adminToken is the admin token of the nodes whose /admin a test asks
// (adminStatus).
const adminToken = "test-admin-token"

func adminStatus(t *testing.T, httpAddr, name string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/admin/parked?source="+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
