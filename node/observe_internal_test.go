package node

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ordo-relay/ordo/relay"
)

// confirmAll is a relay.Publisher that confirms every message at once.
type confirmAll struct{}

func (confirmAll) Publish(_ context.Context, _ *relay.Message, settle func(relay.Result)) error {
	settle(relay.Result{Outcome: relay.Confirmed})
	return nil
}
func (confirmAll) Connected() bool { return true }

// TestPublishMetricsPerSource: the publish counters and the
// commit-to-confirm histogram count each source's messages under its
// source label, and docs/operations.md says they carry it.
func TestPublishMetricsPerSource(t *testing.T) {
	fams := newPublishFamilies()
	reg := prometheus.NewRegistry()
	reg.MustRegister(fams.collectors()...)
	want := map[string]int{"default": 2, "billing": 3}
	for src, n := range want {
		p := observedPublisher{Publisher: confirmAll{}, m: fams.forSource(src, nil)}
		for range n {
			if err := p.Publish(context.Background(), &relay.Message{OccurredAt: time.Now()}, func(relay.Result) {}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range got {
		counts := map[string]int{}
		for _, m := range f.GetMetric() {
			counts[label(m, "source")] = sampleCount(m)
		}
		for _, name := range []string{"ordo_messages_published_total", "ordo_messages_confirmed_total", "ordo_commit_to_confirm_seconds"} {
			if f.GetName() == name && (counts["default"] != want["default"] || counts["billing"] != want["billing"]) {
				t.Errorf("%s by source: %v, want %v", name, counts, want)
			}
		}
		if _, ok := counts["billing"]; !ok {
			t.Errorf("%s has no series for source billing: %v", f.GetName(), counts)
		}
		row := regexp.MustCompile("(?m)^\\| `" + f.GetName() + "` \\| [a-z]+, `source` \\|")
		if !row.Match(doc) {
			t.Errorf("docs/operations.md does not list %s with the label source", f.GetName())
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func sampleCount(m *dto.Metric) int {
	if h := m.GetHistogram(); h != nil {
		return int(h.GetSampleCount())
	}
	return int(m.GetCounter().GetValue())
}
