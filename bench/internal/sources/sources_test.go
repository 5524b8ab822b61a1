package sources

import (
	"cmp"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/shapes"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestSourcesRunsAndNodeEnv: each repetition runs one source once and
// two once per budget mode; the nodes get each source's partition count
// where it is not -partitions, and the bench hook only when unshared; a
// trickle leaves the last source without a backlog.
func TestSourcesRunsAndNodeEnv(t *testing.T) {
	p := defaultSourcesFlags()
	p.Budget = []string{BudgetShared, BudgetUnshared}
	var got []string
	for _, r := range p.runs() {
		got = append(got, r.key())
	}
	if !slices.Equal(got, []string{"1", "2", "2_unshared"}) {
		t.Fatalf("runs %v", got)
	}
	srcs := []nodeSource{{"s1", "postgres://a/x", 8}, {"s2", "postgres://b/y", 32}}
	for _, c := range []struct {
		def    int
		budget string
		want   []string
	}{
		{8, BudgetShared, []string{"ORDO_SOURCES=s1=postgres://a/x s2=postgres://b/y", "ORDO_SOURCE_PARTITIONS=s2=32"}},
		{16, BudgetUnshared, []string{"ORDO_SOURCES=s1=postgres://a/x s2=postgres://b/y", "ORDO_SOURCE_PARTITIONS=s1=8 s2=32",
			"ORDO_BENCH_UNSHARED_BUDGET=1"}},
	} {
		if env := sourcesNodeEnv(srcs, c.def, c.budget); !slices.Equal(env, c.want) {
			t.Errorf("-partitions %d, %s: env\n%q\nwant\n%q", c.def, c.budget, env, c.want)
		}
	}
	if env := sourcesNodeEnv(srcs[:1], 8, BudgetShared); len(env) != 1 {
		t.Errorf("one source of -partitions: env %q", env)
	}
	p.Rows, p.Keys = 40000, 2000
	if rows, keys := p.drainTarget(2); !slices.Equal(rows, []int{20000, 20000}) || !slices.Equal(keys, []int{1000, 1000}) {
		t.Errorf("backlog %v over %v", rows, keys)
	}
	p.Trickle = 50
	if rows, keys := p.drainTarget(2); !slices.Equal(rows, []int{40000, 0}) || !slices.Equal(keys, []int{2000, 0}) {
		t.Errorf("with a trickle: backlog %v over %v", rows, keys)
	}
}

func TestCheckPGTools(t *testing.T) {
	all := func(string) (string, error) { return "/usr/bin/x", nil }
	if err := checkPGTools(0, all); err != nil {
		t.Fatal(err)
	}
	if err := checkPGTools(1000, all); err == nil || !strings.Contains(err.Error(), "run it as root") {
		t.Fatalf("not root: %v", err)
	}
	noCreate := func(s string) (string, error) {
		if s == "pg_createcluster" {
			return "", errors.New("not found")
		}
		return "/usr/bin/" + s, nil
	}
	if err := checkPGTools(0, noCreate); err == nil || !strings.Contains(err.Error(), "pg_createcluster not found") {
		t.Fatalf("without pg_createcluster: %v", err)
	}
}

func TestLeftoverOwner(t *testing.T) {
	for name, want := range map[string]int{"ordo_bench_src_123_1": 123, "ordo_bench_src_9_2": 9} {
		if pid, ok := leftoverOwner(name); !ok || pid != want {
			t.Errorf("%s: %d, %v; want %d", name, pid, ok, want)
		}
	}
	for _, name := range []string{"main", "ordo_bench_src_", "ordo_bench_src_x_1", "ordo_bench_src_12", "ordo_bench_src_0_1", "my_ordo_bench_src_1_1"} {
		if _, ok := leftoverOwner(name); ok {
			t.Errorf("%s taken for the scenario's", name)
		}
	}
}

// fakePG is a cmdRunner that keeps a list of clusters as pg_lsclusters
// would show it and records every command line.
type fakePG struct {
	t        *testing.T
	clusters []listedCluster
	calls    []string
	fail     map[string]error // by command name
	procs    string           // what the fake pg_ctlcluster writes the postmaster into (a cgroup.procs file)
	dataDir  string
}

func (f *fakePG) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := f.fail[name]; err != nil {
		return nil, err
	}
	switch name {
	case "pg_lsclusters":
		var b strings.Builder
		for _, c := range f.clusters {
			status, dir := cmp.Or(c.Status, "down"), cmp.Or(c.DataDir, "/var/lib/postgresql/x")
			b.WriteString(strings.Join([]string{c.Version, c.Name, strconv.Itoa(c.Port), status, "postgres", dir, "/var/log/x.log"}, " ") + "\n")
		}
		return []byte(b.String()), nil
	case "pg_createcluster":
		port, _ := strconv.Atoi(args[3])
		f.clusters = append(f.clusters, listedCluster{Version: args[0], Name: args[1], Port: port, Status: "down", DataDir: f.dataDir})
	case "pg_dropcluster":
		f.clusters = slices.DeleteFunc(f.clusters, func(c listedCluster) bool { return c.Version == args[1] && c.Name == args[2] })
	case "sh":
		// sh -c SCRIPT PROCS pg_ctlcluster ...: the postmaster 4242 lands in PROCS.
		if err := os.WriteFile(filepath.Join(f.dataDir, "postmaster.pid"), []byte("4242\n/data\n"), 0o644); err != nil {
			f.t.Fatal(err)
		}
		if args[2] == f.procs {
			if err := os.WriteFile(f.procs, []byte("4242\n4243\n"), 0o644); err != nil {
				f.t.Fatal(err)
			}
		}
	}
	return nil, nil
}

func newFakePG(t *testing.T, owner int, alive ...int) (*fakePG, *pgClusters) {
	f := &fakePG{t: t, fail: map[string]error{}, dataDir: t.TempDir()}
	f.procs = filepath.Join(t.TempDir(), "cgroup.procs")
	s := newPGClusters(f.Run, "15")
	s.owner = owner
	s.alive = func(pid int) bool { return slices.Contains(alive, pid) }
	return f, s
}

// TestRemoveLeftovers drops the clusters of benches that no longer run,
// and only those.
func TestRemoveLeftovers(t *testing.T) {
	f, s := newFakePG(t, 10, 20)
	f.clusters = []listedCluster{
		{Version: "15", Name: "main", Port: 5432},
		{Version: "15", Name: "ordo_bench_src_30_1", Port: 6000}, // its bench is gone
		{Version: "15", Name: "ordo_bench_src_20_1", Port: 6001}, // a bench running now
		{Version: "14", Name: "ordo_bench_src_31_2", Port: 6002}, // gone, another version
		{Version: "15", Name: "other_30_1", Port: 6003},
	}
	gone, err := s.removeLeftovers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gone, []string{"ordo_bench_src_30_1", "ordo_bench_src_31_2"}) {
		t.Fatalf("dropped %v", gone)
	}
	want := []string{"pg_lsclusters -h", "pg_dropcluster --stop 15 ordo_bench_src_30_1", "pg_dropcluster --stop 14 ordo_bench_src_31_2"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("commands:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
}

// TestClusterLifecycle checks the command lines that make, start and drop
// a cluster, and that the drop runs after the run's context has ended.
func TestClusterLifecycle(t *testing.T) {
	f, s := newFakePG(t, 77)
	ctx, cancel := context.WithCancel(context.Background())
	c, err := s.create(ctx, 1, 6100, 150)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "ordo_bench_src_77_1" || c.DataDir != f.dataDir || c.adminURL() != "postgres://postgres@127.0.0.1:6100/postgres?sslmode=disable" {
		t.Fatalf("cluster %+v, url %s", c, c.adminURL())
	}
	if err := s.Start(ctx, c, f.procs); err != nil {
		t.Fatal(err)
	}
	if c.Postmaster != 4242 {
		t.Fatalf("postmaster %d, want 4242", c.Postmaster)
	}
	cancel() // a failed or interrupted run: the drop must still happen
	if err := s.dropAll(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"pg_createcluster 15 ordo_bench_src_77_1 -p 6100 --start-conf manual -o listen_addresses= 127.0.0.1 -o autovacuum=off -o max_connections=150 -- --auth=trust",
		"pg_lsclusters -h",
		`sh -c echo $$ > "$0" && exec "$@" ` + f.procs + " pg_ctlcluster --skip-systemctl-redirect 15 ordo_bench_src_77_1 start",
		"pg_lsclusters -h",
		"pg_dropcluster --stop 15 ordo_bench_src_77_1",
	}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("commands:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
	if len(f.clusters) != 0 {
		t.Fatalf("left %v", f.clusters)
	}
	if err := s.dropAll(); err != nil || len(f.calls) != len(want) {
		t.Fatalf("second dropAll: %v, %d commands", err, len(f.calls)-len(want))
	}
}

// TestClusterFailures: a cluster whose creation failed halfway is still
// dropped; one whose postmaster is not in the cgroup is refused.
func TestClusterFailures(t *testing.T) {
	f, s := newFakePG(t, 77)
	f.fail["pg_createcluster"] = errors.New("initdb failed")
	f.clusters = append(f.clusters, listedCluster{Version: "15", Name: "ordo_bench_src_77_1"}) // made before it failed
	if _, err := s.create(context.Background(), 1, 6100, 150); err == nil {
		t.Fatal("create succeeded")
	}
	if _, err := s.create(context.Background(), 2, 6101, 150); err == nil {
		t.Fatal("create succeeded")
	}
	if err := s.dropAll(); err != nil {
		t.Fatal(err)
	}
	if last := f.calls[len(f.calls)-1]; last != "pg_dropcluster --stop 15 ordo_bench_src_77_1" || len(f.clusters) != 0 {
		t.Fatalf("last command %q, clusters left %v (the unlisted _2 must not be dropped)", last, f.clusters)
	}

	f, s = newFakePG(t, 78)
	c, err := s.create(context.Background(), 1, 6100, 150)
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(t.TempDir(), "cgroup.procs")
	if err := os.WriteFile(elsewhere, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background(), c, elsewhere); err == nil || !strings.Contains(err.Error(), "not in the CPU cgroup") {
		t.Fatalf("postmaster outside the cgroup: %v", err)
	}
	if err := s.dropAll(); err != nil || len(f.clusters) != 0 {
		t.Fatalf("dropAll: %v, left %v", err, f.clusters)
	}
}

func TestSourcesSummary(t *testing.T) {
	run := func(n int, drain, tps float64, lost int) *result.Result {
		r := result.New("sources")
		r.Param("sources", n)
		if n > 1 {
			r.Param("budget", BudgetShared)
		}
		r.Figure("drain_msgs_per_sec", drain, "msg/s")
		r.Figure("insert_tps", tps, "tps")
		r.Check.Lost = lost
		return r
	}
	p := defaultSourcesFlags()
	p.Reps = 3
	sum := sourcesSummary(p, []*result.Result{run(1, 100, 10, 0), run(2, 190, 21, 0), run(1, 120, 11, 0), run(2, 250, 30, 1), run(1, 80, 9, 0), run(2, 200, 20, 0)})
	for name, want := range map[string]float64{"drain_msgs_per_sec_1": 100, "drain_msgs_per_sec_2": 200, "insert_tps_1": 10, "insert_tps_2": 21,
		"drain_ratio": 2, "insert_ratio": 2.1} {
		if v, ok := sum.Lookup(name); !ok || v < want-1e-9 || v > want+1e-9 {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if sum.Check.Lost != 1 || sum.Passed() {
		t.Fatalf("summary check %+v: a run's loss must fail it", sum.Check)
	}

	unshared := func(drain, p99 float64) *result.Result {
		r := run(2, drain, 0, 0)
		r.Params[len(r.Params)-1].Value = BudgetUnshared
		r.Figure("trickle_p99_ms", p99, "ms")
		return r
	}
	shared := func(drain, p99 float64) *result.Result {
		r := run(2, drain, 0, 0)
		r.Figure("trickle_p99_ms", p99, "ms")
		return r
	}
	p.Counts, p.Budget = []int{2}, []string{BudgetShared, BudgetUnshared}
	sum = sourcesSummary(p, []*result.Result{shared(100, 20), unshared(50, 400), shared(110, 30), unshared(55, 500), shared(90, 10), unshared(45, 300)})
	for name, want := range map[string]float64{"drain_msgs_per_sec_2": 100, "drain_msgs_per_sec_2_unshared": 50,
		"budget_msgs_per_sec_ratio": 2, "trickle_p99_ms_2": 20, "trickle_p99_ms_2_unshared": 400, "budget_trickle_p99_ms_ratio": 0.05} {
		if v, ok := sum.Lookup(name); !ok || v < want-1e-9 || v > want+1e-9 {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}

// TestSourcesOnRealClusters runs the scenario briefly as root: it makes
// two capped clusters, relays one, then both with and without the shared
// Budget, s2 of its own partition count (a node told another count than
// the one s2 was migrated with refuses to start), checks every message,
// and drops the clusters; then a run interrupted once its clusters exist
// leaves none behind. Slow (about two minutes): set ORDO_BENCH_SOURCES_IT=1.
func TestSourcesOnRealClusters(t *testing.T) {
	if os.Getenv("ORDO_BENCH_SOURCES_IT") == "" {
		t.Skip("set ORDO_BENCH_SOURCES_IT=1 to make real PostgreSQL clusters (root, pg_createcluster)")
	}
	testkit.RequireRabbitMQ(t)
	o := DefaultOptions()
	o.Common = measure.DefaultCommon()
	o.AMQPURL, o.Out, o.Partitions, o.Timeout = testkit.AMQPURL(), t.TempDir(), 8, 2*time.Minute
	o.Sources = sourcesFlags{Counts: []int{1, 2}, Cap: 0.3, Period: 20 * time.Millisecond, Rows: 1000, Keys: 100,
		Producers: 4, Duration: time.Second, Warmup: 200 * time.Millisecond, Reps: 1, Nodes: 1, PGVersion: "15",
		Partitions: []int{8, 16}, Budget: []string{BudgetShared, BudgetUnshared}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var got []*result.Result
	if err := Run(ctx, o, func(r *result.Result) { got = append(got, r) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d results, want a run of one source, two of two and the summary", len(got))
	}
	for _, r := range got[:3] {
		if !r.Passed() || r.Check.Distinct < 1000 {
			t.Errorf("%s: %s", r.Label, r.Check.Detail())
		}
		for _, f := range []string{"drain_msgs_per_sec", "insert_tps", "drain_pg_busy_s1", "drain_max_unconfirmed"} {
			if v, _ := r.Lookup(f); !(v > 0) {
				t.Errorf("%s: %s = %v", r.Label, f, v)
			}
		}
	}
	if l, p := got[2].Label, shapes.ParamOf(got[2], "partitions_s2"); l != "sources-2-unshared" || p != "16" {
		t.Errorf("third run %s, s2 of %s partitions; want sources-2-unshared, 16", l, p)
	}
	requireNoClusters(t)

	ictx, icancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ictx, o, func(*result.Result) {}) }()
	testkit.WaitFor(t, 2*time.Minute, "a cluster of the scenario's", func() bool { return len(ourClusters(t)) > 0 })
	icancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Logf("interrupted run: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the interrupted run did not return")
	}
	requireNoClusters(t)
}

func ourClusters(t *testing.T) []string {
	out, err := execRunner(context.Background(), "pg_lsclusters", "-h")
	if err != nil {
		// The interrupted run may be halfway through pg_createcluster.
		t.Log(err)
		return nil
	}
	var names []string
	for _, c := range parseLsClusters(string(out)) {
		if pid, ok := leftoverOwner(c.Name); ok && pid == os.Getpid() {
			names = append(names, c.Name)
		}
	}
	return names
}

func requireNoClusters(t *testing.T) {
	t.Helper()
	cs, err := newPGClusters(execRunner, "15").list(context.Background()) // tries again while one is half made
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if pid, ok := leftoverOwner(c.Name); ok && pid == os.Getpid() {
			t.Errorf("cluster left behind: %s", c.Name)
		}
	}
}
