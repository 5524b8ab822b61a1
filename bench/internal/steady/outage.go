package steady

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// outageTail is how long the producer keeps going after the backlog has
// drained, to see the node back in its steady state.
const outageTail = 2 * time.Second

// outageOptions are outage's: a steady load while the broker link is cut.
type outageOptions struct {
	measure.Common
	measure.KeyedTraffic
	Before time.Duration // steady running before the cut
	Outage time.Duration // how long the broker link stays cut
}

func DefaultOutageOptions() outageOptions {
	return outageOptions{KeyedTraffic: measure.DefaultKeyedTraffic(), Before: 3 * time.Second, Outage: 10 * time.Second}
}

func (o *outageOptions) AddFlags(fs *flag.FlagSet) {
	o.KeyedTraffic.AddFlags(fs)
	fs.DurationVar(&o.Before, "before", o.Before, "steady running before the cut")
	fs.DurationVar(&o.Outage, "outage", o.Outage, "how long the broker link stays cut")
}

func (o outageOptions) Validate() error {
	var errs []error
	if o.Before < 0 || o.Outage <= 0 {
		errs = append(errs, errors.New("before must not be negative and outage must be positive"))
	}
	return errors.Join(append(errs, o.KeyedTraffic.Validate())...)
}

// RunOutage measures recovery from a broker outage. A producer commits
// -rate rows a second (default 500, one row per transaction, keys drawn
// from -keys, default 1000) for the whole run. The node reaches RabbitMQ
// through a TCP proxy; after -before (3 s) the proxy cuts the link for
// -outage (10 s), then restores it. The consumer is connected straight to
// the broker throughout. Measured from the restore: the first delivery of
// a message committed during the outage, and the moment every message
// committed before the restore has arrived.
func RunOutage(ctx context.Context, o outageOptions, emit func(*result.Result)) error {
	res, err := outageOnce(ctx, o)
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

func outageOnce(ctx context.Context, o outageOptions) (*result.Result, error) {
	rate, keys := measure.OrDefault(o.Rate, 500), measure.OrDefault(o.Keys, 1000)
	r, err := measure.NewRig(ctx, o.Common, "outage", int32(o.Workers+1))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New("outage")
	res.Param("nodes", 1)
	res.Param("rate", rate)
	res.Param("keys", keys)
	res.Param("workers", o.Workers)
	res.Param("before", o.Before)
	res.Param("outage", o.Outage)
	res.Param("partitions", o.Partitions)
	res.Param("confirm_window", o.ConfirmWindow)

	c, err := measure.StartRigConsumer(ctx, r, false)
	if err != nil {
		return nil, err
	}
	target, err := hostPort(o.AMQPURL, "5672")
	if err != nil {
		return nil, err
	}
	px, err := r.StartProxy(target)
	if err != nil {
		return nil, err
	}
	viaProxy := px.URL(o.AMQPURL) // o.AMQPURL parsed above (hostPort)
	n, err := r.StartNextNode(ctx, viaProxy)
	if err != nil {
		return nil, err
	}
	if err := n.WaitReady(ctx, min(o.Timeout, time.Minute)); err != nil {
		return nil, err
	}

	p, err := measure.NewProducer(measure.ProducerConfig{Rate: rate, Workers: o.Workers, Keys: keys, Payload: o.Payload, Exchange: r.Exchange}, r.Pool, o.Partitions)
	if err != nil {
		return nil, err
	}
	pctx, cancelProducer := context.WithCancel(ctx)
	producerDone := make(chan error, 1)
	go func() { producerDone <- p.Run(pctx) }()
	// On every return path the producer is stopped and waited for.
	stopProducer := sync.OnceValue(func() error {
		cancelProducer()
		return <-producerDone
	})
	defer stopProducer()

	if err := harness.Sleep(ctx, o.Before); err != nil {
		return nil, err
	}
	cutAt := time.Now()
	px.Cut()
	fmt.Printf("cut the node's broker link for %v\n", o.Outage)
	if err := harness.Sleep(ctx, o.Outage); err != nil {
		return nil, err
	}
	restoreAt := time.Now()
	px.Restore()
	fmt.Println("restored the node's broker link")
	backlog := p.CommittedBefore(restoreAt)
	if err := c.WaitAll(ctx, backlog, o.Timeout, n.Failed); err != nil {
		return nil, err
	}
	if err := harness.Sleep(ctx, outageTail); err != nil {
		return nil, err
	}
	if err := stopProducer(); err != nil {
		return nil, err
	}
	ids, commits := p.Snapshot()
	if err := c.WaitAll(ctx, ids, o.Timeout, n.Failed); err != nil {
		return nil, err
	}
	if _, err := r.WaitPending(ctx, n.Failed, nil); err != nil {
		return nil, err
	}
	detectedAt, detected := n.LineAfter("RabbitMQ unavailable", cutAt)
	reopenedAt, reopened := n.LineAfter("RabbitMQ channel open", restoreAt)
	if _, err := n.Stop(harness.NodeStopTimeout); err != nil {
		return nil, err
	}

	m := MeasureOutage(ids, commits, c.ReceiveTimes(), cutAt, restoreAt, o.Before)
	ps := p.Stats()
	res.Figure("committed_during_outage", float64(m.DuringOutage), "")
	res.Figure("backlog_at_restore", float64(m.Backlog), "")
	res.Figure("delivered_during_outage", float64(m.DeliveredDuringOutage), "")
	if detected {
		res.Seconds("outage_noticed_seconds", detectedAt.Sub(cutAt))
	}
	if reopened {
		res.Seconds("channel_open_seconds", reopenedAt.Sub(restoreAt))
	}
	if !m.FirstAfterRestore.IsZero() {
		res.Seconds("first_delivery_after_restore_seconds", m.FirstAfterRestore.Sub(restoreAt))
	}
	if !m.FirstOutageMsg.IsZero() {
		res.Seconds("first_outage_msg_seconds", m.FirstOutageMsg.Sub(restoreAt))
	}
	res.Seconds("backlog_drained_seconds", m.DrainedAt.Sub(restoreAt))
	if d := m.DrainedAt.Sub(m.FirstAfterRestore); d > 0 && m.Backlog > 0 {
		res.Figure("backlog_msgs_per_sec", float64(m.Backlog)/d.Seconds(), "msg/s")
	}
	if len(m.Steady) > 0 {
		d := measure.DistributionOf(m.Steady)
		res.Millis("steady_latency_p50", d.P50)
		res.Millis("steady_latency_p99", d.P99)
	}
	res.Figure("msgs", float64(ps.Committed), "")
	res.Figure("achieved_rate", float64(ps.Committed)/ps.Elapsed.Seconds(), "msg/s")
	res.Figure("producer_missed", float64(ps.Missed), "")
	res.Figure("producer_errors", float64(ps.Errors), "")
	res.Check = c.Report(ids)
	res.Finished = time.Now()
	if !reopened {
		res.Note("the node never logged \"RabbitMQ channel open\" after the restore")
	}
	return res, nil
}

// outageTimes is what happened around an outage, from every committed
// message's commit and first receive times.
type outageTimes struct {
	FirstOutageMsg        time.Time       // first delivery of a message committed during the outage
	FirstAfterRestore     time.Time       // first delivery of any message after the restore
	DrainedAt             time.Time       // last delivery of a message committed before the restore
	DuringOutage          int             // messages committed during the outage
	Backlog               int             // committed before the restore, delivered after it
	DeliveredDuringOutage int             // deliveries between cut and restore
	Steady                []time.Duration // latencies before the cut, first second excluded
}

func MeasureOutage(ids []string, commits map[string]measure.CommitTimes, recv map[string]time.Time, cutAt, restoreAt time.Time, before time.Duration) outageTimes {
	var m outageTimes
	steadyFrom := cutAt.Add(-before + time.Second)
	for _, id := range ids {
		ct, got := commits[id].Committed, recv[id]
		if got.IsZero() {
			continue // never delivered: the checker reports it as lost
		}
		if !got.Before(restoreAt) && (m.FirstAfterRestore.IsZero() || got.Before(m.FirstAfterRestore)) {
			m.FirstAfterRestore = got
		}
		if !got.Before(cutAt) && got.Before(restoreAt) {
			m.DeliveredDuringOutage++
		}
		if !ct.Before(restoreAt) {
			continue
		}
		if !got.Before(restoreAt) {
			m.Backlog++
		}
		if got.After(m.DrainedAt) {
			m.DrainedAt = got
		}
		switch {
		case !ct.Before(cutAt):
			m.DuringOutage++
			if m.FirstOutageMsg.IsZero() || got.Before(m.FirstOutageMsg) {
				m.FirstOutageMsg = got
			}
		case ct.After(steadyFrom) && got.Before(cutAt):
			// Delivered before the cut: messages caught in flight by the
			// cut wait for the restore and are not steady state.
			m.Steady = append(m.Steady, got.Sub(ct))
		}
	}
	return m
}

// hostPort returns the host:port of rawURL, with defPort when it has none.
func hostPort(rawURL, defPort string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", rawURL, err)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), defPort), nil
	}
	return u.Host, nil
}
