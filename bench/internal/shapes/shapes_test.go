package shapes

import (
	"context"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/charts"
	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/partition"
)

func TestShapeDefs(t *testing.T) {
	want := map[string][2]int{ // rows, keys of the timed groups, full size
		"1x20000": {20000, 1}, "10x2000": {20000, 10}, "1000x20": {20000, 1000}, "30000x1": {30000, 30000},
		"10000x10": {100000, 10000}, "100000x10": {1000000, 100000},
	}
	full, quick := ShapeDefs(false), ShapeDefs(true)
	if len(full) != len(quick) {
		t.Fatalf("%d shapes, %d quick ones", len(full), len(quick))
	}
	seen := map[string]bool{}
	for i, d := range full {
		if seen[d.name] {
			t.Fatalf("shape %s twice", d.name)
		}
		seen[d.name] = true
		if w, ok := want[d.name]; ok {
			rows, keys, _ := drain.PlanSize(d.groups)
			if rows != w[0] || keys != w[1] {
				t.Errorf("%s: %d rows over %d keys, want %d over %d", d.name, rows, keys, w[0], w[1])
			}
			qrows, _, _ := drain.PlanSize(quick[i].groups)
			if qrows*10 != rows {
				t.Errorf("%s: quick has %d rows, want a tenth of %d", d.name, qrows, rows)
			}
		}
	}
	parked := full[slicesIndex(full, shapeParked)]
	rows, keys, poisoned := drain.PlanSize(parked.groups)
	if rows != 20000+200*51 || keys != 1200 || poisoned != 200 || parked.classic {
		t.Errorf("parked: %d rows, %d keys, %d poisoned, classic %v", rows, keys, poisoned, parked.classic)
	}
	if brows, _, bp := drain.PlanSize(parked.base); brows != 20000 || bp != 0 {
		t.Errorf("parked base: %d rows, %d poisoned; want the same run without the parked keys", brows, bp)
	}
	if big := full[slicesIndex(full, "100000x10")]; len(big.analyze) != 1 || big.analyze[0] {
		t.Errorf("the million-row shape runs %v; want without ANALYZE only", big.analyze)
	}
}

func slicesIndex(defs []shapeDef, name string) int {
	for i, d := range defs {
		if d.name == name {
			return i
		}
	}
	return -1
}

func TestSplitRelayCPU(t *testing.T) {
	tests := []struct {
		name              string
		active            map[string]int
		read, mark, other time.Duration
	}{
		{"by share", map[string]int{"read": 30, "mark": 10, "lease": 10, "bench": 50}, 600 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond},
		{"no samples", map[string]int{"bench": 3}, 0, 0, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := measure.SplitRelayCPU(time.Second, measure.ActivityReport{Samples: 100, Active: tc.active})
			if s.Read != tc.read || s.Mark != tc.mark || s.Other != tc.other {
				t.Fatalf("split = %+v, want read %v mark %v other %v", s, tc.read, tc.mark, tc.other)
			}
		})
	}
}

func TestClassifyCurrentQueries(t *testing.T) {
	for q, want := range map[string]string{
		"SELECT o.id FROM unnest($1::int[]) CROSS JOIN LATERAL (SELECT * FROM outbox AS x WHERE x.processed_at IS NULL)": "read",
		"WITH m AS (...), held AS (SELECT FROM ordo_leases) UPDATE outbox AS o SET processed_at = clock_timestamp()":     "mark",
		"SELECT count(*) FROM outbox WHERE processed_at IS NULL":                                                         "bench",
		"SELECT pid, application_name FROM pg_stat_activity WHERE datname = $1":                                          "bench",
		"SELECT id FROM outbox WHERE processed_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED":                  "read",
	} {
		if got := measure.Classify(q); got != want {
			t.Errorf("classify(%.40q) = %s, want %s", q, got, want)
		}
	}
}

func TestShapeRatiosAndTable(t *testing.T) {
	sum := result.New("shapes")
	sum.Param("shape", "1x20000")
	sum.Param("msgs", 20000)
	for name, v := range map[string]float64{
		"classic_msgs_per_sec": 2000, "classic_msgs_per_sec_noanalyze": 1000,
		"ordo_msgs_per_sec": 1500, "ordo_msgs_per_sec_noanalyze": 750, "ordo_complete_noanalyze": 0,
		"ordo_pg_insert_us": 30, "ordo_pg_read_us": 10, "ordo_pg_mark_us": 5,
	} {
		sum.Figure(name, v, "")
	}
	addShapeRatios(sum, 3000)
	for name, want := range map[string]float64{
		"ordo_over_classic": 0.75, "ordo_over_classic_noanalyze": 0.75, "ordo_noanalyze_over_analyze": 0.5,
		"classic_noanalyze_over_analyze": 0.5, "ordo_over_stopwait": 0.5, "ordo_pg_read_mark_us": 15, "ordo_pg_sum_us": 45,
	} {
		if got, ok := sum.Lookup(name); !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, want)
		}
	}
	if _, ok := sum.Lookup("parked_over_base"); ok {
		t.Error("parked_over_base without a parked run")
	}
	var b strings.Builder
	printShapeTable(&b, []*result.Result{sum})
	for _, s := range []string{"| 1x20000 | 20000 | 2,000 / 1,000 | 1,500 / 750* |", "0.50× ÷ stop-and-wait", "10+5"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, b.String())
		}
	}
}

func TestParseCPUStat(t *testing.T) {
	m := measure.ParseCPUStat("nr_periods 120\nnr_throttled 7\nthrottled_time 123456\nbad line here\n")
	if m["nr_periods"] != 120 || m["nr_throttled"] != 7 || len(m) != 3 {
		t.Fatalf("parseCPUStat = %v", m)
	}
}

func TestCapPeriod(t *testing.T) {
	for _, tc := range []struct {
		cores        float64
		period, want time.Duration
	}{
		{0.1, 10 * time.Millisecond, 10 * time.Millisecond},
		{0.05, 10 * time.Millisecond, 20 * time.Millisecond},
		{0.5, 100 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := measure.CapPeriod(tc.cores, tc.period); got != tc.want {
			t.Errorf("capPeriod(%v, %v) = %v, want %v", tc.cores, tc.period, got, tc.want)
		}
	}
}

// fakeHierarchy lays out the control files of a cgroup hierarchy under a
// temporary directory: the kernel's files are plain files there, so the
// writes can be read back.
func fakeHierarchy(t *testing.T, version int) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	switch version {
	case 1:
		write(filepath.Join(root, "cpu", "cpu.cfs_quota_us"), "-1")
		write(filepath.Join(root, "cpu", "cgroup.procs"), "")
	case 2:
		write(filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory")
		write(filepath.Join(root, "cgroup.subtree_control"), "")
		write(filepath.Join(root, "cgroup.procs"), "")
	}
	return root
}

func TestCPUCaps(t *testing.T) {
	for _, tc := range []struct {
		version int
		files   map[string]string // file in the child -> content written
	}{
		{1, map[string]string{"cpu.cfs_period_us": "20000", "cpu.cfs_quota_us": "1000", "cgroup.procs": "4242"}},
		{2, map[string]string{"cpu.max": "1000 20000", "cgroup.procs": "4242"}},
	} {
		t.Run("v"+string(rune('0'+tc.version)), func(t *testing.T) {
			root := fakeHierarchy(t, tc.version)
			c, err := measure.NewCPUCaps(root, 0.05, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if c.Version != tc.version {
				t.Fatalf("version %d, want %d", c.Version, tc.version)
			}
			if tc.version == 2 {
				// enableCPU wrote +cpu into the plain file: the parent's
				// subtree_control now names it.
				b, _ := os.ReadFile(filepath.Join(c.Parent, "cgroup.subtree_control"))
				if string(b) != "+cpu" {
					t.Fatalf("parent subtree_control = %q", b)
				}
			}
			if err := c.Cap("n1", 4242); err != nil {
				t.Fatal(err)
			}
			for f, want := range tc.files {
				b, err := os.ReadFile(filepath.Join(c.Parent, "n1", f))
				if err != nil || string(b) != want {
					t.Errorf("%s = %q (%v), want %q", f, b, err, want)
				}
			}
			if err := os.WriteFile(filepath.Join(c.Parent, "n1", "cpu.stat"), []byte("nr_periods 9\nnr_throttled 4\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Throttled(); err != nil || n != 4 {
				t.Fatalf("throttled = %d, %v; want 4", n, err)
			}
			// A fake group's control files are plain files that rmdir would
			// refuse to remove; the kernel's vanish with the directory.
			for _, f := range []string{"cpu.stat", "cgroup.procs", "cpu.max", "cpu.cfs_period_us", "cpu.cfs_quota_us", "cgroup.subtree_control"} {
				_ = os.Remove(filepath.Join(c.Parent, "n1", f))
				_ = os.Remove(filepath.Join(c.Parent, f))
			}
			if err := c.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if measure.FileExists(c.Parent) {
				t.Fatal("parent group left behind")
			}
		})
	}
	if _, err := measure.NewCPUCaps(t.TempDir(), 0.1, 10*time.Millisecond); err != measure.ErrNoCgroup {
		t.Fatalf("no hierarchy: %v, want errNoCgroup", err)
	}
}

func TestSpreadLimit(t *testing.T) {
	const P = 64
	all := make([]string, P)
	for p := range all {
		all[p] = "n1"
	}
	if got := spreadLimit(all, P, "key", 10); got != 1 {
		t.Fatalf("one owner: %v, want 1", got)
	}
	// Give key-0's partition to n2: n1 keeps the rest (unless they share it).
	split := append([]string(nil), all...)
	p0 := partition.Of("key-0", P)
	split[p0] = "n2"
	onN1 := 0
	for k := range 10 {
		if partition.Of("key-"+string(rune('0'+k)), P) != p0 {
			onN1++
		}
	}
	if got, want := spreadLimit(split, P, "key", 10), 10/float64(max(onN1, 10-onN1)); got != want {
		t.Fatalf("split: %v, want %v", got, want)
	}
}

func TestCharts(t *testing.T) {
	dir := t.TempDir()
	write := func(r *result.Result) {
		t.Helper()
		if _, err := r.WriteJSON(dir); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Now()
	for i, n := range []int{1, 2, 3, 4} {
		for j, shape := range []string{"many", "hot"} {
			r := result.New("scaleout")
			r.Started = base.Add(time.Duration(2*i+j) * time.Second) // distinct file names
			r.Param("shape", shape)
			r.Param("nodes", n)
			r.Param("cap_cores", 0.05)
			r.Param("cgroup", "v1")
			r.Figure("msgs_per_sec", float64(1000*n), "msg/s")
			write(r)
		}
	}
	s := result.New("shapes")
	s.Started = base.Add(20 * time.Second)
	s.Param("shape", "10x2000")
	s.Figure("classic_msgs_per_sec", 2000, "")
	s.Figure("ordo_msgs_per_sec", 4000, "")
	s.Figure("ordo_over_classic", 2, "")
	write(s)
	l := result.New("latency")
	l.Label = "ordo-1"
	l.Started = base.Add(30 * time.Second)
	l.Param("rate", 1000)
	l.AddSeries("latency_ms", []float64{-0.5, 1, 2, 3, 50})
	write(l)

	o := charts.Options{Common: measure.Common{Out: dir}, Charts: filepath.Join(dir, "charts")}
	if err := charts.Run(context.Background(), o, nil); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{charts.ChartScaleout, charts.ChartShapes, charts.ChartLatency} {
		fh, err := os.Open(filepath.Join(o.Charts, f))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(fh)
		fh.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if b := img.Bounds(); b.Dx() < 300 || b.Dy() < 200 {
			t.Errorf("%s is %v", f, b)
		}
	}
	if err := charts.Run(context.Background(), charts.Options{Common: measure.Common{Out: t.TempDir()}, Charts: t.TempDir()}, nil); err == nil {
		t.Fatal("charts from no results did not fail")
	}
}

// TestShapesEndToEnd drains two tiny shapes against the real servers with
// the real node binary: one with both relays and both ANALYZE variants,
// one with parked keys, and checks the summaries' figures and counts.
func TestShapesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL, RabbitMQ and a node build")
	}
	testkit.RequirePostgres(t)
	testkit.RequireRabbitMQ(t)
	o := Options{
		Common: measure.Common{PostgresURL: testkit.PostgresURL(), AMQPURL: testkit.AMQPURL(), Out: t.TempDir(),
			Partitions: 8, ConfirmWindow: 64, NodeBin: testkit.BuildBinary(t, "github.com/ordo-relay/ordo/cmd/node"),
			Timeout: 60 * time.Second},
		Traffic: measure.Traffic{Payload: 50, Workers: 2}, ClassicPolling: measure.ClassicPolling{ClassicBatch: 50, ClassicEvery: 100 * time.Millisecond},
		ShapeLimit: 60 * time.Second, Warmup: 200 * time.Millisecond,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var emitted []*result.Result
	emit := func(r *result.Result) { emitted = append(emitted, r) }

	plain := shapeDef{name: "tiny", groups: []drain.RowGroup{{Prefix: "key", Keys: 5, Rows: 60}}, analyze: []bool{true, false}, classic: true, keys: 5}
	sum, err := runShape(ctx, o, plain, emit, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"classic_msgs_per_sec", "classic_msgs_per_sec_noanalyze", "ordo_msgs_per_sec", "ordo_msgs_per_sec_noanalyze",
		"ordo_over_classic", "ordo_noanalyze_over_analyze", "ordo_pg_sum_us", "ordo_node_rss_peak"} {
		if v, ok := sum.Lookup(f); !ok || math.IsNaN(v) || (strings.Contains(f, "per_sec") && v <= 0) {
			t.Errorf("%s = %v (%v)", f, v, ok)
		}
	}
	if c := sum.Check; !c.OK() || c.Distinct != 120 {
		t.Errorf("Ordo check %+v, want 120 distinct (60 per variant), nothing lost or reordered", c)
	}
	if len(emitted) != 4 {
		t.Errorf("%d drains emitted, want 4 (2 relays × 2 variants)", len(emitted))
	}

	parked := shapeDef{name: "tiny+parked", analyze: []bool{true}, env: []string{"ORDO_MAX_ATTEMPTS=1"}, keys: 5,
		groups: []drain.RowGroup{{Prefix: "key", Keys: 5, Rows: 40}, {Prefix: "parked", Keys: 2, Rows: 2 * 6, Poison: true}},
		base:   []drain.RowGroup{{Prefix: "key", Keys: 5, Rows: 40}}}
	emitted = nil
	sum, err = runShape(ctx, o, parked, emit, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c := sum.Check; !c.OK() || c.Distinct != 40 {
		t.Errorf("parked run check %+v: want exactly the 40 other rows, no follower of a parked key", c)
	}
	if _, ok := sum.Lookup("parked_over_base"); !ok {
		t.Error("no parked_over_base")
	}
	if n, ok := emitted[0].Lookup("parked"); !ok || n != 2 {
		t.Errorf("parked rows = %v (%v), want 2", n, ok)
	}
}
