package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ordo-relay/ordo/relay"
)

// publishFamilies are the publish counters and the commit-to-confirm
// histogram, labelled by source; forSource gives one source's series.
type publishFamilies struct {
	published, confirmed, nacked, returned, failed, timedOut, unsent *prometheus.CounterVec
	// latency is commit (the row's occurred_at, the database's clock) to
	// confirm (this node's clock) of confirmed messages.
	latency *prometheus.HistogramVec
}

func newPublishFamilies() *publishFamilies {
	c := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, srcLabel)
	}
	return &publishFamilies{
		published: c("ordo_messages_published_total", "Messages handed to the broker."),
		confirmed: c("ordo_messages_confirmed_total", "Messages the broker acked and did not return."),
		nacked:    c("ordo_messages_nacked_total", "Messages the broker nacked."),
		returned:  c("ordo_messages_returned_total", "Messages the broker returned as unroutable (mandatory)."),
		failed:    c("ordo_messages_failed_total", "Messages that failed for a reason of their own (missing exchange, unsendable, no confirm in time)."),
		timedOut:  c("ordo_messages_confirm_timeouts_total", "Messages left unconfirmed past -confirm-timeout on an open channel (also counted in ordo_messages_failed_total)."),
		unsent:    c("ordo_messages_unsent_total", "Messages whose channel or connection closed before their outcome was known (read again, no attempt charged)."),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ordo_commit_to_confirm_seconds",
			Help:    "Time from a message's commit (occurred_at, database clock) to its publisher confirm (node clock).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17), // 1 ms .. 65 s
		}, srcLabel),
	}
}

func (f *publishFamilies) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.published, f.confirmed, f.nacked, f.returned, f.failed, f.timedOut, f.unsent, f.latency}
}

// forSource returns source's series, created now so that /metrics shows
// them at 0 before the first message; timedOut tells a failure that is a
// confirm timeout (broker.TimedOut).
func (f *publishFamilies) forSource(source string, timedOut func(error) bool) *publishMetrics {
	return &publishMetrics{isTimeout: timedOut,
		published: f.published.WithLabelValues(source), confirmed: f.confirmed.WithLabelValues(source),
		nacked: f.nacked.WithLabelValues(source), returned: f.returned.WithLabelValues(source),
		failed: f.failed.WithLabelValues(source), timedOut: f.timedOut.WithLabelValues(source),
		unsent: f.unsent.WithLabelValues(source), latency: f.latency.WithLabelValues(source),
	}
}

// publishMetrics are one source's series of the publishFamilies, which
// observedPublisher feeds.
type publishMetrics struct {
	published, confirmed, nacked, returned, failed, timedOut, unsent prometheus.Counter
	latency                                                          prometheus.Observer
	isTimeout                                                        func(error) bool // nil: none counts
}

// observe counts one settled result.
func (m *publishMetrics) observe(msg *relay.Message, res relay.Result, now time.Time) {
	switch res.Outcome {
	case relay.Confirmed:
		m.confirmed.Inc()
		m.latency.Observe(max(now.Sub(msg.OccurredAt).Seconds(), 0))
	case relay.Nacked:
		m.nacked.Inc()
	case relay.Returned:
		m.returned.Inc()
	case relay.Failed:
		m.failed.Inc()
		if m.isTimeout != nil && m.isTimeout(res.Err) {
			m.timedOut.Inc()
		}
	case relay.Unsent:
		m.unsent.Inc()
	}
}

// observedPublisher is a relay.Publisher that counts what it publishes
// and how each message settles, around the publisher it wraps.
type observedPublisher struct {
	relay.Publisher
	m *publishMetrics
}

var (
	_ relay.Publisher = observedPublisher{}
	_ relay.Flusher   = observedPublisher{}
)

// Flush implements relay.Flusher.
func (p observedPublisher) Flush() { relay.Flush(p.Publisher) }

// Publish implements relay.Publisher.
func (p observedPublisher) Publish(ctx context.Context, msg *relay.Message, settle func(relay.Result)) error {
	err := p.Publisher.Publish(ctx, msg, func(res relay.Result) {
		p.m.observe(msg, res, time.Now())
		settle(res)
	})
	if err == nil {
		p.m.published.Inc()
	}
	return err
}
