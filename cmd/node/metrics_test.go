package main

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ordo-relay/ordo/internal/testkit"
)

// scrape reads one node's /metrics and parses it.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %s: %s", addr, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: parse: %v", addr, err)
	}
	return fams
}

// value sums a family's samples (counter, gauge, or a histogram's count).
func value(fams map[string]*dto.MetricFamily, name string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	var v float64
	for _, m := range f.GetMetric() {
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		}
	}
	return v
}

// labelled returns a per-partition family's value for partition p.
func labelled(fams map[string]*dto.MetricFamily, name, p string) float64 {
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "partition" && l.GetValue() == p {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1
}

// wantTypes are the node's metrics and their types: the names and types
// docs/operations.md lists and dashboards and alerts rely on.
var wantTypes = map[string]dto.MetricType{
	"ordo_partitions":                           dto.MetricType_GAUGE,
	"ordo_partitions_assigned":                  dto.MetricType_GAUGE,
	"ordo_partitions_held":                      dto.MetricType_GAUGE,
	"ordo_partition_pending":                    dto.MetricType_GAUGE,
	"ordo_partition_parked":                     dto.MetricType_GAUGE,
	"ordo_partition_oldest_pending_age_seconds": dto.MetricType_GAUGE,
	"ordo_partition_lease_live":                 dto.MetricType_GAUGE,
	"ordo_backlog_snapshot_age_seconds":         dto.MetricType_GAUGE,
	"ordo_backlog_available":                    dto.MetricType_GAUGE,
	"ordo_backlog_refreshes_total":              dto.MetricType_COUNTER,
	"ordo_backlog_refresh_failures_total":       dto.MetricType_COUNTER,
	"ordo_backlog_refresh_duration_seconds":     dto.MetricType_GAUGE,
	"ordo_messages_published_total":             dto.MetricType_COUNTER,
	"ordo_messages_confirmed_total":             dto.MetricType_COUNTER,
	"ordo_messages_nacked_total":                dto.MetricType_COUNTER,
	"ordo_messages_returned_total":              dto.MetricType_COUNTER,
	"ordo_messages_failed_total":                dto.MetricType_COUNTER,
	"ordo_messages_confirm_timeouts_total":      dto.MetricType_COUNTER,
	"ordo_messages_unsent_total":                dto.MetricType_COUNTER,
	"ordo_messages_marked_total":                dto.MetricType_COUNTER,
	"ordo_message_failures_recorded_total":      dto.MetricType_COUNTER,
	"ordo_messages_parked_total":                dto.MetricType_COUNTER,
	"ordo_marks_refused_total":                  dto.MetricType_COUNTER,
	"ordo_retention_deleted_total":              dto.MetricType_COUNTER,
	"ordo_commit_to_confirm_seconds":            dto.MetricType_HISTOGRAM,
	"ordo_relay_reads_total":                    dto.MetricType_COUNTER,
	"ordo_relay_read_rows_total":                dto.MetricType_COUNTER,
	"ordo_relay_read_seconds_total":             dto.MetricType_COUNTER,
	"ordo_relay_marks_total":                    dto.MetricType_COUNTER,
	"ordo_relay_mark_seconds_total":             dto.MetricType_COUNTER,
	"ordo_relay_idle_reads_total":               dto.MetricType_COUNTER,
	"ordo_relay_lease_skipped_total":            dto.MetricType_COUNTER,
	"ordo_relay_stalled_seconds":                dto.MetricType_GAUGE,
	"ordo_relay_in_flight":                      dto.MetricType_GAUGE,
	"ordo_relay_unconfirmed":                    dto.MetricType_GAUGE,
	"ordo_relay_confirm_window":                 dto.MetricType_GAUGE,
	"ordo_budget_slots":                         dto.MetricType_GAUGE,
	"ordo_budget_slots_used":                    dto.MetricType_GAUGE,
	"ordo_budget_bytes":                         dto.MetricType_GAUGE,
	"ordo_budget_bytes_used":                    dto.MetricType_GAUGE,
	"ordo_budget_source_slots_used":             dto.MetricType_GAUGE,
	"ordo_budget_source_bytes_used":             dto.MetricType_GAUGE,
	"ordo_lease_claims_total":                   dto.MetricType_COUNTER,
	"ordo_lease_renewal_failures_total":         dto.MetricType_COUNTER,
	"ordo_lease_losses_total":                   dto.MetricType_COUNTER,
	"ordo_lease_handoffs_total":                 dto.MetricType_COUNTER,
	"ordo_lease_handoff_timeouts_total":         dto.MetricType_COUNTER,
	"ordo_rebalances_total":                     dto.MetricType_COUNTER,
	"ordo_broker_connected":                     dto.MetricType_GAUGE,
	"ordo_database_reachable":                   dto.MetricType_GAUGE,
	"ordo_gossip_members":                       dto.MetricType_GAUGE,
	"ordo_gossip_members_gone":                  dto.MetricType_GAUGE,
	"ordo_degraded":                             dto.MetricType_GAUGE,
	"ordo_source_identity_conflicts":            dto.MetricType_GAUGE,
	"go_goroutines":                             dto.MetricType_GAUGE,
	"process_resident_memory_bytes":             dto.MetricType_GAUGE,
}

// tableTypes are the metrics a node exports only for a source that
// relays an adopted table (-table-layout, -source-layout), and their
// types; TestClusterAdoptedTableKillNode scrapes them.
var tableTypes = map[string]dto.MetricType{
	"ordo_table_late_rows_total": dto.MetricType_COUNTER,
}

// TestMetricsUnderLoad scrapes the /metrics of a running two-node cluster
// before and after load: every metric is there with its type, every
// partition is exported by every node, counters and the latency histogram
// move, and a message sent to a missing exchange shows up as parked.
func TestMetricsUnderLoad(t *testing.T) {
	f := newFixture(t)
	c := newCluster(t, f, 2, "ORDO_MAX_ATTEMPTS=2", "ORDO_RETRY_MIN=20ms", "ORDO_RETRY_MAX=50ms", "ORDO_BACKLOG_INTERVAL=200ms")
	c.waitConverged(t, []int{0, 1}, 30*time.Second)

	before := []map[string]*dto.MetricFamily{scrape(t, c.http[0]), scrape(t, c.http[1])}
	for i, fams := range before {
		for name, typ := range wantTypes {
			fam, ok := fams[name]
			if !ok {
				t.Errorf("node %d: %s missing", i, name)
				continue
			}
			if fam.GetType() != typ {
				t.Errorf("node %d: %s is a %v, want %v", i, name, fam.GetType(), typ)
			}
		}
		if n := len(fams["ordo_partition_pending"].GetMetric()); n != 64 {
			t.Errorf("node %d exports the backlog of %d partitions, want all 64", i, n)
		}
	}
	if held := value(before[0], "ordo_partitions_held") + value(before[1], "ordo_partitions_held"); held != 64 {
		t.Errorf("the nodes hold %v partitions between them, want 64", held)
	}

	const n = 600
	f.enqueue(t, n, 60)
	poison := "missing-" + testkit.UniqueName(t, "ex")
	ids := f.enqueueTo(t, poison, "poison-key", "rk", 1)
	var poisonPart string
	if err := f.pool.QueryRow(ctx30(t), `SELECT partition::text FROM outbox WHERE id = $1`, ids[0]).Scan(&poisonPart); err != nil {
		t.Fatal(err)
	}
	f.checker.WaitDistinct(t, n, 60*time.Second)

	// Wait for the marks and the parking to reach both nodes' metrics.
	deadline := time.Now().Add(30 * time.Second)
	var after []map[string]*dto.MetricFamily
	for {
		after = []map[string]*dto.MetricFamily{scrape(t, c.http[0]), scrape(t, c.http[1])}
		marked := value(after[0], "ordo_messages_marked_total") + value(after[1], "ordo_messages_marked_total")
		// Each node's backlog snapshot refreshes on its own clock: wait
		// for both.
		parked := min(labelled(after[0], "ordo_partition_parked", poisonPart), labelled(after[1], "ordo_partition_parked", poisonPart))
		// Drained, nothing is held: the parked message is charged nothing.
		held := value(after[0], "ordo_budget_bytes_used") + value(after[1], "ordo_budget_bytes_used") +
			value(after[0], "ordo_budget_slots_used") + value(after[1], "ordo_budget_slots_used")
		if marked >= n && parked == 1 && held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after load: %v marked (want %d), partition %s shows %v parked on some node (want 1 on both), budget bytes and slots used %v (want 0)",
				marked, n, poisonPart, parked, held)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sum := func(name string) float64 { return value(after[0], name) + value(after[1], name) }
	for _, name := range []string{"ordo_messages_published_total", "ordo_messages_confirmed_total", "ordo_commit_to_confirm_seconds"} {
		if got := sum(name); got < n {
			t.Errorf("%s: %v after %d messages", name, got, n)
		}
	}
	if got := sum("ordo_messages_failed_total"); got < 2 {
		t.Errorf("ordo_messages_failed_total: %v, want at least 2 (the missing exchange, twice)", got)
	}
	if got := sum("ordo_messages_parked_total"); got != 1 {
		t.Errorf("ordo_messages_parked_total: %v, want 1", got)
	}
	for _, name := range []string{"ordo_relay_read_rows_total", "ordo_relay_marks_total"} {
		if got := sum(name) - value(before[0], name) - value(before[1], name); got <= 0 {
			t.Errorf("%s did not move under load", name)
		}
	}
	if got := sum("ordo_relay_reads_total") - value(before[0], "ordo_relay_reads_total") - value(before[1], "ordo_relay_reads_total"); got <= 0 {
		t.Errorf("ordo_relay_reads_total did not move")
	}
	for i := range after {
		if got := labelled(after[i], "ordo_partition_parked", poisonPart); got != 1 {
			t.Errorf("node %d: ordo_partition_parked{partition=%q} = %v, want 1 (every node exports every partition)", i, poisonPart, got)
		}
		if got := value(after[i], "ordo_gossip_members"); got != 2 {
			t.Errorf("node %d: ordo_gossip_members = %v, want 2", i, got)
		}
		if got := value(after[i], "ordo_database_reachable") + value(after[i], "ordo_broker_connected"); got != 2 {
			t.Errorf("node %d: database and broker gauges sum to %v, want 2", i, got)
		}
	}
}

// TestMetricsDocumented keeps docs/operations.md's metric list exact: it
// names every ordo_ metric the node exports, and no other.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?m)^\\| `(ordo_[a-z0-9_]+)` \\|")
	var documented []string
	for _, m := range re.FindAllStringSubmatch(string(doc), -1) {
		if !strings.HasSuffix(m[1], "_bucket") && !slices.Contains(documented, m[1]) {
			documented = append(documented, m[1])
		}
	}
	for name := range tableTypes {
		if !slices.Contains(documented, name) {
			t.Errorf("docs/operations.md does not list %s", name)
		}
	}
	for name := range wantTypes {
		if strings.HasPrefix(name, "ordo_") && !slices.Contains(documented, name) {
			t.Errorf("docs/operations.md does not list %s", name)
		}
	}
	for _, name := range documented {
		// ordo_orderapi_* are the order API's; ordo_inbox_* the consumers'
		// (cmd/shipping's TestMetricsInOperations checks those).
		_, table := tableTypes[name]
		if _, ok := wantTypes[name]; !ok && !table && !strings.HasPrefix(name, "ordo_orderapi_") && !strings.HasPrefix(name, "ordo_inbox_") && name != "ordo_broker_blocked" {
			t.Errorf("docs/operations.md lists %s, which the node does not export", name)
		}
	}
}
