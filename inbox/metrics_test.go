package inbox_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// TestConsumerCollector: the collector exports the inbox's counters and
// gauges, labelled with the consumer, and the handler duration and lag
// histograms, from a real consumer.
func TestConsumerCollector(t *testing.T) {
	_, pool := newDB(t)
	cfg := consumerConfig(t, 2)
	r := startConsumer(t, cfg, "a", pool, failOnce("a", func(m *inbox.Message) bool { return m.CorrelationID == "f" }))
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.c.Collector())
	pub := newPublisher(t, cfg.Exchange)
	pub.publish("a", 1)
	pub.publish("a", 2)
	pub.publish("f", 1)
	want := map[string]int64{"a": 2, "f": 1}
	waitHandled(t, pool, want)
	testkit.WaitFor(t, 30*time.Second, "metrics", func() bool {
		m := gather(t, reg, cfg.Name)
		return m["ordo_inbox_handled_total"] == 3 && m["ordo_inbox_retries_total"] == 1 &&
			m["ordo_inbox_shards_owned"] == 2 && m["ordo_inbox_handler_duration_seconds"] == 4 &&
			m["ordo_inbox_lag_seconds"] == 3
	})
	m := gather(t, reg, cfg.Name)
	for _, name := range []string{"ordo_inbox_duplicates_total", "ordo_inbox_dead_lettered_total", "ordo_inbox_stuck_keys",
		"ordo_inbox_dead_keys", "ordo_inbox_fenced_total", "ordo_inbox_invalid_total", "ordo_inbox_key_seq_rewinds_total",
		"ordo_inbox_gaps_stored_total"} {
		if v, ok := m[name]; !ok || v != 0 {
			t.Errorf("%s = %v (exported %v), want 0", name, v, ok)
		}
	}
}

// gather returns each family's value for consumer: a counter's or gauge's
// value, a histogram's sample count.
func gather(tb testing.TB, reg *prometheus.Registry, consumer string) map[string]float64 {
	tb.Helper()
	fams, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if !hasLabel(m, "consumer", consumer) {
				continue
			}
			switch {
			case m.Counter != nil:
				out[f.GetName()] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[f.GetName()] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[f.GetName()] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// collectorMetricNames returns the name of every metric the inbox's
// collector describes, failing when there are fewer than 13.
func collectorMetricNames(t *testing.T) []string {
	t.Helper()
	c, err := inbox.New(inbox.Config{Name: "doc", Exchange: "x"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 64)
	c.Collector().Describe(ch)
	close(ch)
	var names []string
	for d := range ch {
		name := d.String()[strings.Index(d.String(), `fqName: "`)+9:]
		names = append(names, name[:strings.Index(name, `"`)])
	}
	if len(names) < 13 {
		t.Fatalf("%d metrics described, want at least 13", len(names))
	}
	return names
}

// TestMetricsDocumented: every metric the collector exports is named in
// docs/consumer.md.
func TestMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/consumer.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range collectorMetricNames(t) {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("%s is not in docs/consumer.md", name)
		}
	}
}

// TestMetricsInOperations: every metric the collector exports is in the
// consumer table of docs/operations.md, which the alerts and the
// dashboard are checked against (internal/composecheck).
func TestMetricsInOperations(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range collectorMetricNames(t) {
		if !strings.Contains(string(doc), "| `"+name+"` |") {
			t.Errorf("%s is not a row of docs/operations.md's consumer metrics table", name)
		}
	}
}
