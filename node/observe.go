package node

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// publishMetrics are the counters and the latency histogram that
// observedPublisher feeds.
type publishMetrics struct {
	published, confirmed, nacked, returned, failed, timedOut, unsent prometheus.Counter
	// latency is commit (the row's occurred_at, the database's clock) to
	// confirm (this node's clock) of confirmed messages.
	latency prometheus.Histogram
}

func newPublishMetrics() *publishMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return &publishMetrics{
		published: c("ordo_messages_published_total", "Messages handed to the broker."),
		confirmed: c("ordo_messages_confirmed_total", "Messages the broker acked and did not return."),
		nacked:    c("ordo_messages_nacked_total", "Messages the broker nacked."),
		returned:  c("ordo_messages_returned_total", "Messages the broker returned as unroutable (mandatory)."),
		failed:    c("ordo_messages_failed_total", "Messages that failed for a reason of their own (missing exchange, unsendable, no confirm in time)."),
		timedOut:  c("ordo_messages_confirm_timeouts_total", "Messages left unconfirmed past -confirm-timeout on an open channel (also counted in ordo_messages_failed_total)."),
		unsent:    c("ordo_messages_unsent_total", "Messages whose channel or connection closed before their outcome was known (read again, no attempt charged)."),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ordo_commit_to_confirm_seconds",
			Help:    "Time from a message's commit (occurred_at, database clock) to its publisher confirm (node clock).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17), // 1 ms .. 65 s
		}),
	}
}

func (m *publishMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.confirmed, m.nacked, m.returned, m.failed, m.timedOut, m.unsent, m.latency}
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
		if errors.Is(res.Err, rabbitmq.ErrConfirmTimeout) {
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

var _ relay.Publisher = observedPublisher{}

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
