package produce

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestProduceSummary checks the medians and the ratios to classic on
// made-up runs.
func TestProduceSummary(t *testing.T) {
	run := func(v string, commits int, p99 time.Duration, pg time.Duration, wal int64) produceRun {
		return produceRun{variant: v, rows: 2, producers: 4, commits: commits, window: time.Second,
			commit: measure.Distribution{P50: p99 / 2, P99: p99}, pgBackend: pg, walDB: wal, walServer: 2 * wal}
	}
	runs := []produceRun{
		run(variantClassic, 1000, 10*time.Millisecond, 200*time.Millisecond, 100_000),
		run(VariantOrdoSQL, 600, 12*time.Millisecond, 400*time.Millisecond, 200_000),
		run(variantClassic, 3000, 30*time.Millisecond, 600*time.Millisecond, 300_000), // median of three: the middle one
		run(VariantOrdoSQL, 900, 24*time.Millisecond, 540*time.Millisecond, 360_000),
		run(variantClassic, 2000, 20*time.Millisecond, 400*time.Millisecond, 200_000),
		run(VariantOrdoSQL, 300, 6*time.Millisecond, 120*time.Millisecond, 60_000),
	}
	runs[5].walDB = -1 // not inspected: the server's figure stands in
	o := Options{Payload: 300, Produce: produceFlags{Variants: []string{variantClassic, VariantOrdoSQL}, Reps: 3, Duration: time.Second}}
	res := produceCellResult(o, 2, 4, runs)
	want := map[string]float64{
		"classic_tps":                      2000,
		"classic_msgs_per_sec":             4000,
		"classic_commit_p99":               20,
		"classic_pg_us_per_msg":            100, // 400 ms / 4,000 messages
		"classic_wal_bytes_per_msg":        50,
		"ordo_sql_tps":                     600,
		"ordo_sql_commit_p99":              12,
		"ordo_sql_commit_p50":              6,
		"ordo_sql_pg_us_per_msg":           300, // runs: 333.3, 300, 200
		"ordo_sql_wal_bytes_per_msg":       200, // runs: 166.7, 200, 200 (the server's 120,000 / 600)
		"ordo_sql_over_classic_tps":        0.3,
		"ordo_sql_over_classic_commit_p99": 0.6,
	}
	for name, w := range want {
		got, ok := res.Lookup(name)
		if !ok || math.Abs(got-w) > 1e-3*math.Abs(w) {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, w)
		}
	}
	if _, ok := res.Lookup("classic_over_classic_tps"); ok {
		t.Error("classic compared with itself")
	}
	if m := Median([]float64{math.NaN(), 1, 3}); m != 2 {
		t.Errorf("median leaves NaN out: got %v", m)
	}
	if !math.IsNaN(fratio(1, 0)) || !math.IsNaN(Median(nil)) {
		t.Error("a ratio to 0 or a median of nothing is not NaN")
	}
	var b strings.Builder
	printProduceTable(&b, []*result.Result{res}, o.Produce.Variants)
	if !strings.Contains(b.String(), "| 2 | 4 | ordo-sql | 600 | 0.30× | 6.00 / 12.00 | 0.60× |") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestProduceEndToEnd runs every variant briefly against the real server
// and checks that each committed and was measured.
func TestProduceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	testkit.RequirePostgres(t)
	testkit.RequireRabbitMQ(t) // ordo-sql-relay runs a node
	o := Options{
		Common: measure.Common{PostgresURL: testkit.PostgresURL(), AMQPURL: testkit.AMQPURL(), Out: t.TempDir(), Partitions: 8,
			ConfirmWindow: 64, Timeout: time.Minute},
		Keys: 50, Payload: 300,
		Produce: produceFlags{Duration: 400 * time.Millisecond, Warmup: 100 * time.Millisecond, Producers: []int{2},
			Rows: []int{1, 3}, Reps: 1, WALInspect: true},
	}
	for _, v := range Variants {
		o.Produce.Variants = append(o.Produce.Variants, v.name)
	}
	// Seven variants in two cells, two of them starting a relay: a loaded
	// machine (load 30) needed over 3 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var cells []*result.Result
	if err := Run(ctx, o, func(r *result.Result) { cells = append(cells, r) }); err != nil {
		t.Fatal(err)
	}
	if len(cells) != 2 {
		t.Fatalf("%d cells, want 2 (1 and 3 rows)", len(cells))
	}
	for _, c := range cells {
		classic, _ := c.Lookup("classic_tps")
		for _, v := range o.Produce.Variants {
			p := figureName(v) + "_"
			tps, _ := c.Lookup(p + "tps")
			if tps <= 0 {
				t.Errorf("%s: %s tps = %v", c.Label, v, tps)
			}
			if errs, _ := c.Lookup(p + "errors"); errs != 0 {
				t.Errorf("%s: %s had %v failed transactions", c.Label, v, errs)
			}
			if wal, _ := c.Lookup(p + "wal_bytes_per_msg"); !(wal > 100) {
				t.Errorf("%s: %s wrote %v bytes of WAL per ~300-byte message", c.Label, v, wal)
			}
			if p99, _ := c.Lookup(p + "commit_p99"); !(p99 > 0) {
				t.Errorf("%s: %s commit p99 %v", c.Label, v, p99)
			}
			if FindVariant(v).relay != relayNone {
				// The relay (a node, or the classic instance) ran and its
				// backends were measured apart.
				if whole, _ := c.Lookup(p + "pg_whole_us_per_msg"); !(whole > 0) {
					t.Errorf("%s: %s whole PostgreSQL CPU per message %v", c.Label, v, whole)
				}
			}
			if v == variantClassic {
				continue
			}
			if r, _ := c.Lookup(p + "over_classic_tps"); math.Abs(r-tps/classic) > 1e-3*r {
				t.Errorf("%s: %s over classic %v, want %v / %v", c.Label, v, r, tps, classic)
			}
		}
	}
}
