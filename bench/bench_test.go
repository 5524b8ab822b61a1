package main

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/consume"
	"github.com/ordo-relay/ordo/bench/internal/drain"
	"github.com/ordo-relay/ordo/bench/internal/measure"
	"github.com/ordo-relay/ordo/bench/internal/shapes"
	"github.com/ordo-relay/ordo/bench/internal/steady"

	"github.com/google/uuid"

	"github.com/ordo-relay/ordo/bench/internal/result"
	"github.com/ordo-relay/ordo/internal/testkit"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of four is the second", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 0.99, 99 * time.Millisecond},
		{"p100 is the max", ms(1, 2, 3), 1, 3 * time.Millisecond},
		{"p0 is the min", ms(1, 2, 3), 0, 1 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := result.Percentile(tc.sorted, tc.q); got != tc.want {
				t.Fatalf("percentile(%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestResultLine(t *testing.T) {
	r := result.New("drain")
	r.Param("nodes", 1)
	r.Param("outage", 10*time.Second)
	r.Figure("msgs_per_sec", 8130.123456789, "msg/s")
	r.Check = result.Check{Total: 3, Distinct: 3}
	want := "RESULT scenario=drain nodes=1 outage=10s msgs_per_sec=8130.12 total=3 distinct=3 duplicates=0 lost=0 reorders=0 gaps=0"
	if got := r.Line(); got != want {
		t.Fatalf("Line() =\n%s\nwant\n%s", got, want)
	}
	var b strings.Builder
	r.Check.Lost, r.Check.Reorders = 2, 1
	r.Print(&b)
	for _, loud := range []string{"!!! LOST 2", "!!! REORDERED 1"} {
		if !strings.Contains(b.String(), loud) {
			t.Errorf("Print does not say %q:\n%s", loud, b.String())
		}
	}
}

// parseOne parses args, which must name one scenario whose options are of
// type O, and returns them.
func parseOne[O any](t *testing.T, lookup func(string) (string, bool), args ...string) O {
	t.Helper()
	invs, err := parseArgs(args, lookup, io.Discard)
	if err != nil || len(invs) != 1 {
		t.Fatalf("parseArgs(%q) = %d scenarios, %v; want one", args, len(invs), err)
	}
	o, ok := any(invs[0].o).(*O)
	if !ok {
		t.Fatalf("parseArgs(%q) gave options of type %T", args, invs[0].o)
	}
	return *o
}

func TestParseArgs(t *testing.T) {
	env := map[string]string{"ORDO_BENCH_ROWS": "500", "ORDO_BENCH_RATE": "200", "ORDO_BENCH_TIMEOUT": "1m"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	invs, err := parseArgs([]string{"-partitions", "16", "latency", "-rate", "300", "drain", "-nodes", "1,2"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(invs) != 2 || invs[0].s.name != "latency" || invs[1].s.name != "drain" {
		t.Fatalf("%d scenarios, want latency then drain", len(invs))
	}
	lat, drain := invs[0].o.(*steady.LatencyOptions), invs[1].o.(*drain.Options)
	if lat.Rate != 300 || measure.OrDefault(lat.Keys, 10000) != 10000 {
		t.Fatalf("latency: rate %d, want 300 (its flag beats the environment)", lat.Rate)
	}
	if drain.Rows != 500 || len(drain.Nodes) != 2 {
		t.Fatalf("drain: rows %d nodes %v; want 500 (environment), 1,2", drain.Rows, drain.Nodes)
	}
	for _, o := range []*measure.Common{&lat.Common, &drain.Common} {
		if o.Partitions != 16 || o.Timeout != time.Minute {
			t.Fatalf("common flags: partitions %d timeout %v, want 16 (flag) and 1m (environment)", o.Partitions, o.Timeout)
		}
	}
	for _, bad := range [][]string{
		{"nosuch"},
		{"drain", "-rate", "300"},     // not a flag of drain
		{"-rows", "1000", "drain"},    // a scenario flag before the scenario
		{"drain", "-nodes", "0"},      // out of range
		{"latency", "-warmup", "40s"}, // longer than the duration
	} {
		if _, err := parseArgs(bad, lookup, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := parseArgs([]string{"-rows", "1"}, lookup, io.Discard); !errors.Is(err, errNoScenarioFlag) {
		t.Errorf("a scenario flag before any scenario: %v, want errNoScenarioFlag", err)
	}
	if invs, err := parseArgs([]string{"all"}, lookup, io.Discard); err != nil || len(invs) != len(scenarios) {
		t.Fatalf("all = %d scenarios, %v", len(invs), err)
	}
}

// TestScenarioHelpListsItsOwnFlags: -h after a scenario lists its flags
// and no other scenario's; every scenario has a help.
func TestScenarioHelpListsItsOwnFlags(t *testing.T) {
	var b strings.Builder
	if _, err := parseArgs([]string{"drain", "-h"}, nil, &b); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("drain -h: %v", err)
	}
	for _, want := range []string{"-rows", "-nodes", "ORDO_BENCH_ROWS"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("drain -h lacks %s:\n%s", want, b.String())
		}
	}
	for _, other := range []string{"-shapes", "-rate", "-produce-reps", "-postgres-url"} {
		if strings.Contains(b.String(), other+" ") {
			t.Errorf("drain -h lists %s:\n%s", other, b.String())
		}
	}
	for _, s := range allScenarios() {
		var b strings.Builder
		if _, err := parseArgs([]string{s.name, "-h"}, nil, &b); !errors.Is(err, flag.ErrHelp) || !strings.Contains(b.String(), s.summary) {
			t.Errorf("%s -h: %v\n%s", s.name, err, b.String())
		}
	}
}

// TestScenarioTakesOnlyItsFlags: each scenario takes exactly its flags
// (all of them given here, with values in range, parse), and a flag of
// another scenario given to it is an error that names the scenarios that
// take it.
func TestScenarioTakesOnlyItsFlags(t *testing.T) {
	traffic := []string{"-payload", "10", "-rate", "100", "-workers", "2"}
	keyed := append([]string{"-keys", "50"}, traffic...)
	polling := []string{"-classic-batch", "10", "-classic-interval", "100ms"}
	backlog := []string{"-rows", "500", "-keys", "50", "-payload", "10"}
	join := func(parts ...[]string) []string { return slices.Concat(parts...) }
	tests := []struct {
		scenario string
		own      []string // every flag of the scenario, with a value in range
		foreign  string   // a flag of other scenarios
		owner    string   // one of them
	}{
		{"drain", join(backlog, []string{"-analyze=false", "-nodes", "1,2", "-lean", "-wal-inspect"}), "-rate", "latency"},
		{"outage", join(keyed, []string{"-before", "1s", "-outage", "2s"}), "-rows", "drain"},
		{"latency", join(keyed, []string{"-duration", "5s", "-warmup", "1s", "-lean"}), "-nodes", "drain"},
		{"broker", join(backlog, []string{"-broker-window", "8"}), "-workers", "latency"},
		{"classic", join(backlog, polling, []string{"-analyze", "-instances", "1"}), "-nodes", "drain"},
		{"classic-latency", join(keyed, polling, []string{"-duration", "5s", "-warmup", "1s", "-instances", "2"}), "-rows", "broker"},
		{"orders", []string{"-rate", "100", "-orders-workers", "4", "-duration", "5s", "-warmup", "1s", "-orders-api-conns", "4", "-lean"}, "-nodes", "drain"},
		{"race", join(traffic, polling, []string{"-orders", "10", "-race-instances", "1", "-race-nodes", "1"}), "-keys", "drain"},
		{"failover", join(keyed, []string{"-reps", "1", "-failover-target", "2s"}), "-join-target", "join"},
		{"join", join(keyed, []string{"-reps", "1", "-join-target", "2s"}), "-failover-target", "failover"},
		{"shapes", join(traffic, polling, []string{"-warmup", "1s", "-shapes", "10x2000", "-shape-limit", "1m", "-shape-steady", "0s",
			"-parked-keys", "50", "-parked-followers", "1", "-parked-loaded", "-parked-held", "-vacuum", "-lean"}),
			"-duration", "latency"},
		{"scaleout", []string{"-payload", "10", "-scale-nodes", "1,2", "-scale-cap", "0.5", "-scale-period", "20ms",
			"-scale-shapes", "hot", "-scale-rows", "100", "-scale-keys", "10", "-scale-hot-rows", "100"}, "-shapes", "shapes"},
		{"consume", []string{"-workers", "2", "-consume-instances", "1", "-consume-orders", "10", "-consume-rate", "5",
			"-consume-latency", "1s", "-consume-delay", "0s", "-consume-conns", "2", "-consume-lanes", "2", "-consume-batch", "4",
			"-consume-batch-time", "20ms", "-consume-shards", "2", "-consume-queued"},
			"-produce-reps", "produce"},
		{"produce", []string{"-payload", "10", "-keys", "5", "-produce-duration", "1s", "-produce-warmup", "0s",
			"-produce-producers", "1", "-produce-rows", "1", "-produce-reps", "1", "-produce-variants", "all", "-produce-rate", "0",
			"-produce-wal-inspect=false", "-produce-sleep", "2ms"}, "-consume-orders", "consume"},
		{"sources", []string{"-payload", "10", "-sources-counts", "1", "-sources-cap", "0.5", "-sources-period", "20ms",
			"-sources-rows", "100", "-sources-keys", "10", "-sources-producers", "2", "-sources-duration", "1s",
			"-sources-warmup", "0s", "-sources-reps", "1", "-sources-nodes", "1", "-sources-node-cap", "0",
			"-sources-pg-version", "16", "-sources-partitions", "8", "-sources-budget", "shared", "-sources-trickle", "0"},
			"-produce-reps", "produce"},
		{"charts", []string{"-charts", "/tmp/charts"}, "-rows", "drain"},
		{"compare", join(backlog, polling, []string{"-analyze", "-lean", "-wal-inspect", "-broker-window", "8", "-rate", "100", "-workers", "2",
			"-duration", "5s", "-warmup", "1s", "-orders", "10", "-race-instances", "1", "-race-nodes", "1", "-reps", "1",
			"-failover-target", "2s", "-join-target", "2s"}), "-nodes", "drain"},
	}
	none := func(string) (string, bool) { return "", false }
	tested := map[string]bool{}
	for _, tc := range tests {
		t.Run(tc.scenario, func(t *testing.T) {
			tested[tc.scenario] = true
			s := findScenario(tc.scenario)
			var want, got []string
			for _, a := range tc.own {
				if name, ok := strings.CutPrefix(a, "-"); ok {
					name, _, _ = strings.Cut(name, "=")
					want = append(want, name)
				}
			}
			scenarioFlagSet(s, s.options()).VisitAll(func(f *flag.Flag) { got = append(got, f.Name) })
			slices.Sort(want)
			if want = slices.Compact(want); !slices.Equal(got, want) {
				t.Errorf("flags %v, want %v", got, want)
			}
			if _, err := parseArgs(append([]string{tc.scenario}, tc.own...), none, io.Discard); err != nil {
				t.Errorf("its own flags: %v", err)
			}
			_, err := parseArgs([]string{tc.scenario, tc.foreign, "1"}, none, io.Discard)
			var nf *notItsFlagError
			if !errors.As(err, &nf) || nf.Common || !slices.Contains(nf.Owners, tc.owner) || slices.Contains(nf.Owners, tc.scenario) {
				t.Fatalf("%s %s 1: %v; want it rejected as a flag of %s", tc.scenario, tc.foreign, err, tc.owner)
			}
			for _, want := range []string{tc.foreign + " is not a flag of " + tc.scenario + " but of ", tc.owner, "go run ./bench " + tc.scenario + " -h"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q lacks %q", err, want)
				}
			}
		})
	}
	for _, s := range allScenarios() {
		if !tested[s.name] {
			t.Errorf("scenario %s is not in the table", s.name)
		}
	}
	var nf *notItsFlagError
	if _, err := parseArgs([]string{"drain", "-quick"}, none, io.Discard); !errors.As(err, &nf) || !nf.Common {
		t.Errorf("drain -quick: %v, want a common flag after the scenario", err)
	}
	if _, err := parseArgs([]string{"drain", "-nosuch"}, none, io.Discard); !errors.As(err, &nf) || len(nf.Owners) != 0 ||
		!strings.Contains(err.Error(), "nor of any scenario") {
		t.Errorf("drain -nosuch: %v, want no scenario's flag", err)
	}
}

func TestMeasureOutage(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	cut, restore := at(3), at(13)
	// id: commit time, receive time
	msgs := map[string][2]float64{
		"steady":    {2.0, 2.004},   // before the cut, delivered before it
		"warmup":    {0.5, 0.51},    // in the first second: not steady state
		"caught":    {2.99, 13.4},   // in flight at the cut: backlog, not steady
		"routed":    {2.995, 3.001}, // routed before the link died
		"outage1":   {5, 14.5},
		"outage2":   {12, 15.0},
		"afterward": {13.5, 13.2 + 0.4},
	}
	var ids []string
	commits := map[string]measure.CommitTimes{}
	recv := map[string]time.Time{}
	for id, v := range msgs {
		ids = append(ids, id)
		commits[id] = measure.CommitTimes{Committed: at(v[0])}
		recv[id] = at(v[1])
	}
	m := steady.MeasureOutage(ids, commits, recv, cut, restore, 3*time.Second)
	if m.DuringOutage != 2 || m.Backlog != 3 || m.DeliveredDuringOutage != 1 {
		t.Errorf("during=%d backlog=%d deliveredDuring=%d; want 2 3 1", m.DuringOutage, m.Backlog, m.DeliveredDuringOutage)
	}
	if !m.FirstOutageMsg.Equal(at(14.5)) || !m.DrainedAt.Equal(at(15)) || !m.FirstAfterRestore.Equal(at(13.4)) {
		t.Errorf("firstOutage=%v drained=%v firstAfter=%v", m.FirstOutageMsg.Sub(t0), m.DrainedAt.Sub(t0), m.FirstAfterRestore.Sub(t0))
	}
	if len(m.Steady) != 1 || m.Steady[0] != 4*time.Millisecond {
		t.Errorf("steady = %v, want [4ms]", m.Steady)
	}
}

func TestParseCounts(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []int
		ok   bool
	}{
		{"one", "1", []int{1}, true},
		{"list with spaces", "1, 2,3", []int{1, 2, 3}, true},
		{"zero", "0", nil, false},
		{"too many", "9", nil, false},
		{"not a number", "a", nil, false},
		{"empty item", "1,,2", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := measure.ParseCounts("nodes", tc.in)
			if (err == nil) != tc.ok || tc.ok && !slices.Equal(got, tc.want) {
				t.Fatalf("parseCounts(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
			}
		})
	}
}

func TestDefaultScenarioAndQuick(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	invs, err := parseArgs([]string{"-quick"}, none, io.Discard)
	if err != nil || len(invs) != 1 || invs[0].s.name != "compare" {
		t.Fatalf("no scenario runs %d scenarios (%v), want compare", len(invs), err)
	}
	o := parseOne[compareOptions](t, none, "-quick", "compare", "-rows", "5000")
	if o.drain.Rows != 5000 || o.broker.Rows != 5000 || o.classic.Rows != 5000 || o.drain.Keys != 2000 || o.failover.Reps != 1 ||
		o.race.Orders != 1000 || o.latency.Duration != 10*time.Second || o.classicLatency.Duration != 10*time.Second {
		t.Fatalf("-quick with -rows 5000: rows %d/%d/%d (drain/broker/classic), keys %d, reps %d, orders %d, durations %v/%v",
			o.drain.Rows, o.broker.Rows, o.classic.Rows, o.drain.Keys, o.failover.Reps, o.race.Orders, o.latency.Duration, o.classicLatency.Duration)
	}
	if !slices.Equal(o.drain.Nodes, []int{1, 2, 3}) || !slices.Equal(o.classic.Instances, []int{1, 2}) {
		t.Fatalf("compare: drain nodes %v, classic instances %v; want 1,2,3 and 1,2", o.drain.Nodes, o.classic.Instances)
	}
	if c := parseOne[consume.Options](t, none, "-quick", "consume").Consume; c.Orders != 300 || c.Latency != 3*time.Second {
		t.Fatalf("-quick consume: orders %d latency %v, want 300 and 3s", c.Orders, c.Latency)
	}
	if o := parseOne[shapes.Options](t, none, "-quick", "shapes"); o.Warmup != 2*time.Second || !o.Quick {
		t.Fatalf("-quick shapes: warmup %v quick %v, want 2s (not a -quick flag) and true", o.Warmup, o.Quick)
	}
}

func TestBaselineReordersDoNotFail(t *testing.T) {
	r := result.New("race")
	r.Label = "classic-2"
	r.Baseline = true
	r.Check = result.Check{Total: 4, Distinct: 4, Reorders: 1, Gaps: 1}
	if !r.Passed() {
		t.Fatal("a baseline's reorders failed the run")
	}
	var b strings.Builder
	r.Print(&b)
	if !strings.Contains(b.String(), "!!! REORDERED 1 (the classic baseline") {
		t.Fatalf("Print does not say the reorder loudly:\n%s", b.String())
	}
	if !strings.HasPrefix(r.Line(), "RESULT scenario=race label=classic-2 ") {
		t.Fatalf("Line = %s", r.Line())
	}
	r.Check.Lost = 1
	if r.Passed() {
		t.Fatal("a baseline's loss passed")
	}
	r.Baseline = false
	r.Check.Lost = 0
	if r.Passed() {
		t.Fatal("Ordo's reorders passed")
	}
}

func TestMeasureRace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	commits := map[string]measure.CommitTimes{
		"p1": {Key: "o1", Typ: "OrderPlaced", Committed: at(0)},
		"c1": {Key: "o1", Typ: "OrderCancelled", Committed: at(2)},
		"p2": {Key: "o2", Typ: "OrderPlaced", Committed: at(1)},
		"c2": {Key: "o2", Typ: "OrderCancelled", Committed: at(4)},
		"p3": {Key: "o3", Typ: "OrderPlaced", Committed: at(5)}, // its Cancel never committed
	}
	recv := map[string]time.Time{
		"p1": at(10), "c1": at(11), // in order
		"p2": at(30), "c2": at(20), // reversed
		"p3": at(12),
	}
	m := steady.MeasureRace([]string{"p1", "p2", "c1", "c2", "p3"}, commits, recv)
	if m.Orders != 2 || m.Reversed != 1 || len(m.Gaps) != 2 {
		t.Fatalf("orders=%d reversed=%d gaps=%v; want 2 1 [2ms 3ms]", m.Orders, m.Reversed, m.Gaps)
	}
}

func TestPublishLag(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	first := map[int]measure.EpochFirst{
		1: {At: at(130), ID: "backlog"}, // committed before the claim: lag from the claim
		2: {At: at(250), ID: "later"},   // committed after the claim: lag from the commit
	}
	claims := map[int]time.Time{1: at(100), 2: at(100)}
	commits := map[string]measure.CommitTimes{"backlog": {Committed: at(50)}, "later": {Committed: at(240)}}
	if got := steady.PublishLag(first, claims, commits); got != 30*time.Millisecond {
		t.Fatalf("publishLag = %v, want 30ms", got)
	}
}

func TestComparisonRatios(t *testing.T) {
	mk := func(scenario, label string, figs map[string]float64) *result.Result {
		r := result.New(scenario)
		r.Label = label
		for k, v := range figs {
			r.Figure(k, v, "")
		}
		return r
	}
	rs := []*result.Result{
		mk("broker", "", map[string]float64{"msgs_per_sec": 10000}),
		mk("classic", "classic-1", map[string]float64{"msgs_per_sec": 2000}),
		mk("drain", "ordo-1", map[string]float64{"msgs_per_sec": 4000}),
		mk("drain", "ordo-3", map[string]float64{"msgs_per_sec": 6000}),
		mk("failover", "", map[string]float64{"publish_again_seconds_max": 3.5}),
	}
	o := defaultCompareOptions()
	rows := buildComparison(rs, o)
	byKey := map[string]comparisonRow{}
	for _, r := range rows {
		byKey[r.key] = r
	}
	for key, want := range map[string]float64{"ordo1_over_broker": 0.4, "ordo1_over_classic1": 2, "ordo3_over_ordo1": 1.5} {
		if got := byKey[key].ratio; got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
	if got := byKey["failover_seconds_max"].shown; got != "ABOVE" {
		t.Errorf("failover 3.5 s against 3 s shown as %q", got)
	}
	if got := byKey["ordo2_over_ordo1"].shown; got != "—" {
		t.Errorf("a missing figure shown as %q", got)
	}
	var b strings.Builder
	printComparison(&b, rows)
	if !strings.Contains(b.String(), "2.00×") {
		t.Errorf("table:\n%s", b.String())
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := measure.Thousands(in); got != want {
			t.Errorf("thousands(%d) = %q, want %q", in, got, want)
		}
	}
}

// newTestConsumer returns a consumer with no connection, for record.
func newTestConsumer() *measure.Consumer {
	return &measure.Consumer{Rec: testkit.NewRecorder(), Recv: map[string]time.Time{}, Epochs: map[int]map[int64]measure.EpochFirst{}}
}

func TestConsumerFirstAbove(t *testing.T) {
	c := newTestConsumer()
	t0 := time.Unix(1000, 0)
	for _, d := range []testkit.Delivery{
		{MessageID: "a", CorrelationID: "k", KeySeq: 1, Partition: 7, Epoch: 3, Received: t0},
		{MessageID: "b", CorrelationID: "k", KeySeq: 2, Partition: 7, Epoch: 4, Received: t0.Add(time.Second)},
		{MessageID: "c", CorrelationID: "k", KeySeq: 3, Partition: 7, Epoch: 5, Received: t0.Add(2 * time.Second)},
	} {
		c.Record(d)
	}
	if f, ok := c.FirstAbove(7, 3); !ok || f.ID != "b" {
		t.Fatalf("firstAbove(7, 3) = %+v, %v; want b", f, ok)
	}
	if _, ok := c.FirstAbove(7, 5); ok {
		t.Fatal("firstAbove(7, 5) found a delivery")
	}
	if _, ok := c.FirstAbove(8, 0); ok {
		t.Fatal("firstAbove of an unseen partition found a delivery")
	}
}

// BenchmarkConsumerRecord is the bench's own cost per delivery (checker,
// receive times, epochs): it runs on the same two cores as the relays.
func BenchmarkConsumerRecord(b *testing.B) {
	c := newTestConsumer()
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Record(testkit.Delivery{
			MessageID: ids[i%len(ids)], CorrelationID: "key-" + strconv.Itoa(i%10000),
			KeySeq: int64(i/10000) + 1, PrevKeySeq: int64(i / 10000), HasPrevKeySeq: true,
			Partition: i % 64, Epoch: 1, Received: now,
		})
		i++
	}
}

// BenchmarkDistribution is the percentile summary of a 30 s latency run.
func BenchmarkDistribution(b *testing.B) {
	ds := make([]time.Duration, 30000)
	for i := range ds {
		ds[i] = time.Duration((i*7919)%30000) * time.Microsecond
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = measure.DistributionOf(ds)
	}
}
