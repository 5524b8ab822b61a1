package inbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The names of the inbox's scrape-time metrics (docs/consumer.md,
// "Metrics and operations"); each has a constant label consumer =
// Config.Name.
const (
	metricHandled    = "ordo_inbox_handled_total"
	metricDuplicates = "ordo_inbox_duplicates_total"
	metricStored     = "ordo_inbox_gaps_stored_total"
	metricRetries    = "ordo_inbox_retries_total"
	metricDead       = "ordo_inbox_dead_lettered_total"
	metricInvalid    = "ordo_inbox_invalid_total"
	metricFenced     = "ordo_inbox_fenced_total"
	metricRewinds    = "ordo_inbox_key_seq_rewinds_total"
	metricStuck      = "ordo_inbox_stuck_keys"
	metricDeadKeys   = "ordo_inbox_dead_keys"
	metricOwned      = "ordo_inbox_shards_owned"
	metricLaneLimit  = "ordo_inbox_lanes_limit"
)

// metricHelp is every scrape-time metric's help text, by name.
var metricHelp = map[string]string{
	metricHandled:    "Handler transactions committed.",
	metricDuplicates: "Messages dropped: their key was past them, or they were already stored.",
	metricStored:     "Messages stored to wait for a predecessor (gaps), or behind a stored earlier message of their key.",
	metricRetries:    "Messages failed (or redelivered) and stored for a retry.",
	metricDead:       "Messages dead-lettered (sent to <name>.dead, key held), held below the low-water mark included.",
	metricInvalid:    "Deliveries without a correlation id or the Ordo headers, with an invalid x-ordo-source, or with data PostgreSQL cannot store, dead-lettered.",
	metricFenced:     "Writes refused because the shard's lease moved.",
	metricRewinds:    "A handled key_seq seen again under another message id (the producer's key_seq went back).",
	metricStuck:      "Keys whose gap waited longer than GapWait.",
	metricDeadKeys:   "Dead-lettered messages holding their keys.",
	metricOwned:      "Shards this instance holds.",
	metricLaneLimit:  "Lanes of all shards allowed at work at once: at most the pool's connections less 2, fewer while handlers take little of the lanes' time.",
}

// storeMetrics are the Store's histograms, observed as messages are
// handled.
type storeMetrics struct {
	handler prometheus.Histogram // every handler run, failed ones included
	lag     prometheus.Histogram // producer's timestamp to commit, for handled messages with one
}

func newStoreMetrics(name string) storeMetrics {
	labels := prometheus.Labels{"consumer": name}
	return storeMetrics{
		handler: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ordo_inbox_handler_duration_seconds", ConstLabels: labels,
			Help:    "Duration of a handler run, in its transaction (failed runs included).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15), // 1 ms .. 16 s
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ordo_inbox_lag_seconds", ConstLabels: labels,
			Help: "From the producer's occurred_at (the AMQP timestamp, whole seconds: up to 1 s more) " +
				"to the commit of the message's handler transaction.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600},
		}),
	}
}

// handled records m's commit (lag) now.
func (sm storeMetrics) handled(m *Message) {
	if !m.Timestamp.IsZero() {
		sm.lag.Observe(max(time.Since(m.Timestamp).Seconds(), 0))
	}
}

// Collector returns a prometheus.Collector of c's metrics: the counters
// and gauges of Stats, read at scrape time, and the handler duration and
// lag histograms. Each carries the label consumer = Config.Name, so the
// collectors of several consumers can share a registry. Register it once.
func (c *Consumer) Collector() prometheus.Collector { return consumerCollector{c} }

type consumerCollector struct{ c *Consumer }

func (cc consumerCollector) desc(name string) *prometheus.Desc {
	return prometheus.NewDesc(name, metricHelp[name], nil, prometheus.Labels{"consumer": cc.c.cfg.Name})
}

// Describe implements prometheus.Collector.
func (cc consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	for name := range metricHelp {
		ch <- cc.desc(name)
	}
	cc.c.store.metrics.handler.Describe(ch)
	cc.c.store.metrics.lag.Describe(ch)
}

// Collect implements prometheus.Collector.
func (cc consumerCollector) Collect(ch chan<- prometheus.Metric) {
	s := cc.c.Stats()
	for name, v := range map[string]int64{
		metricHandled: s.Handled, metricDuplicates: s.Duplicates, metricStored: s.GapsStored, metricRetries: s.Retries,
		metricDead: s.DeadLettered, metricInvalid: s.Invalid, metricFenced: s.Fenced, metricRewinds: s.Rewinds,
	} {
		ch <- prometheus.MustNewConstMetric(cc.desc(name), prometheus.CounterValue, float64(v))
	}
	for name, v := range map[string]int{metricStuck: s.StuckKeys, metricDeadKeys: s.DeadKeys, metricOwned: s.ShardsOwned, metricLaneLimit: s.LaneLimit} {
		ch <- prometheus.MustNewConstMetric(cc.desc(name), prometheus.GaugeValue, float64(v))
	}
	cc.c.store.metrics.handler.Collect(ch)
	cc.c.store.metrics.lag.Collect(ch)
}
