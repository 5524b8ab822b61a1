package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// latencyOptions are latency's: a steady load for -duration.
type latencyOptions struct {
	common
	keyedTraffic
	Duration time.Duration // how long producers run
	Warmup   time.Duration // commits in this first part are not measured
}

func defaultLatencyOptions() latencyOptions {
	return latencyOptions{keyedTraffic: defaultKeyedTraffic(), Duration: 30 * time.Second, Warmup: 2 * time.Second}
}

func (o *latencyOptions) addFlags(fs *flag.FlagSet) {
	o.keyedTraffic.addFlags(fs)
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long producers run")
	warmupVar(fs, &o.Warmup)
}

func warmupVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "warmup", *p, "commits in this first part of a run are not measured")
}

func (o latencyOptions) validate() error {
	var errs []error
	switch {
	case o.Duration <= 0 || o.Warmup < 0:
		errs = append(errs, errors.New("duration must be positive and warmup not negative"))
	case o.Warmup >= o.Duration:
		errs = append(errs, fmt.Errorf("warmup %v must be shorter than duration %v", o.Warmup, o.Duration))
	}
	return errors.Join(append(errs, o.keyedTraffic.validate())...)
}

// classicLatencyOptions are classic-latency's: latency's, through the
// classic relay on the first count of -instances.
type classicLatencyOptions struct {
	latencyOptions
	classicPolling
	Instances []int // the first is the instance count
}

func defaultClassicLatencyOptions() classicLatencyOptions {
	return classicLatencyOptions{latencyOptions: defaultLatencyOptions(), classicPolling: defaultClassicPolling(), Instances: []int{1}}
}

func (o *classicLatencyOptions) addFlags(fs *flag.FlagSet) {
	o.latencyOptions.addFlags(fs)
	o.classicPolling.addFlags(fs)
	countsVar(fs, "instances", &o.Instances, "classic instances: the first of these comma-separated counts")
}

func (o classicLatencyOptions) validate() error {
	return errors.Join(o.latencyOptions.validate(), o.classicPolling.validate())
}

// runLatency measures Ordo's commit-to-delivery latency with one node:
// see latencyOnce.
func runLatency(ctx context.Context, o latencyOptions, emit func(*result.Result)) error {
	res, err := latencyOnce(ctx, o, ordo(1))
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

// runClassicLatency measures the classic relay's latency the same way,
// with the first count of -instances (default 1).
func runClassicLatency(ctx context.Context, o classicLatencyOptions, emit func(*result.Result)) error {
	res, err := latencyOnce(ctx, o.latencyOptions, classic(o.Instances[0], o.classicPolling))
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

// latencyOnce measures commit-to-delivery latency through the relays of
// spec. Producers commit -rate rows a second (default 1000, one row per
// transaction, keys drawn from -keys, default 10000) for -duration (30 s),
// paced by a ticker. Latency is the consumer's receive time minus the time
// the producer's COMMIT returned, both on the bench's clock; commits in
// the first -warmup (2 s) are not measured.
func latencyOnce(ctx context.Context, o latencyOptions, spec systemSpec) (*result.Result, error) {
	rate, keys := orDefault(o.Rate, 1000), orDefault(o.Keys, 10000)
	scenario := "latency"
	if spec.classic {
		scenario = "classic-latency"
	}
	r, err := newRig(ctx, o.common, scenario, int32(o.Workers+2))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New(scenario)
	res.Label = spec.String()
	spec.addParams(res)
	res.Param("rate", rate)
	res.Param("keys", keys)
	res.Param("workers", o.Workers)
	res.Param("duration", o.Duration)
	res.Param("warmup", o.Warmup)
	res.Param("partitions", o.Partitions)
	if spec.classic {
		res.Param("batch", spec.relay.ClassicBatch)
		res.Param("interval", spec.relay.ClassicEvery)
	} else {
		res.Param("confirm_window", o.ConfirmWindow)
	}

	c, err := startRigConsumer(ctx, r, false)
	if err != nil {
		return nil, err
	}
	sys, err := spec.start(ctx, r)
	if err != nil {
		return nil, err
	}
	p, err := newProducer(producerConfig{Rate: rate, Workers: o.Workers, Keys: keys, Payload: o.Payload, Exchange: r.Exchange}, r.Pool, o.Partitions)
	if err != nil {
		return nil, err
	}
	relayCPU0, err := usageNow(sys)
	if err != nil {
		return nil, err
	}
	cpu0 := sampleCPU()
	act := startActivity(r.Probe, r.Name)
	backends, err := startBackendCPU(ctx, r.Probe, r.Name)
	if err != nil {
		act.stop()
		return nil, err
	}
	fmt.Printf("producing %d msg/s for %v\n", rate, o.Duration)
	pctx, cancel := context.WithTimeout(ctx, o.Duration)
	err = p.run(pctx) // returns when pctx ends, with every transaction finished
	cancel()
	activity := act.stop()
	btotals, berr := backends.stop(ctx)
	if err != nil {
		return nil, err
	}
	if berr != nil {
		res.Note("backend CPU sampling: %v", berr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cpu1 := sampleCPU()
	ps := p.stats()
	if err := addUsage(res, sys, relayCPU0, ps.committed); err != nil {
		return nil, err
	}
	ids, commits := p.snapshot()
	if err := c.waitAll(ctx, ids, o.Timeout, sys.failed); err != nil {
		return nil, err
	}
	if _, err := r.WaitPending(ctx, sys.failed, nil); err != nil {
		return nil, err
	}
	if err := sys.stop(); err != nil {
		return nil, err
	}
	if cs, ok := sys.(*classicSystem); ok {
		cs.addTo(res)
	}

	recv := c.receiveTimes()
	from := p.startedAt().Add(o.Warmup)
	var lat, fromSent, tx, commit []time.Duration
	early := 0
	for _, id := range ids {
		ct := commits[id]
		if ct.begun.Before(from) {
			continue
		}
		d := recv[id].Sub(ct.committed)
		if d < 0 {
			early++ // delivered before the producer saw its COMMIT return
		}
		lat = append(lat, d)
		fromSent = append(fromSent, recv[id].Sub(ct.sent))
		tx = append(tx, ct.committed.Sub(ct.begun))
		commit = append(commit, ct.committed.Sub(ct.sent))
	}
	res.Figure("msgs", float64(ps.committed), "")
	res.Figure("measured", float64(len(lat)), "")
	res.Figure("achieved_rate", float64(ps.committed)/ps.elapsed.Seconds(), "msg/s")
	distributionOf(lat).addTo(res, "latency")
	ds := distributionOf(fromSent)
	res.Millis("latency_from_commit_sent_p50", ds.p50)
	res.Millis("latency_from_commit_sent_p99", ds.p99)
	dt := distributionOf(tx)
	res.Millis("tx_p50", dt.p50)
	res.Millis("tx_p99", dt.p99)
	dc := distributionOf(commit)
	res.Millis("commit_p50", dc.p50)
	res.Millis("commit_p99", dc.p99)
	res.Figure("delivered_before_commit_returned", float64(early), "")
	res.Figure("producer_missed", float64(ps.missed), "")
	res.Figure("producer_errors", float64(ps.errors), "")
	addCPU(res, cpu0, cpu1, "")
	activity.addTo(res)
	// The producers' backends (the bench pool) during the run: the
	// single-row insert and its commit, NOTIFY included.
	res.Figure("pg_insert_us_per_msg", perMsgMicros(btotals[groupBench], ps.committed), "µs")
	split := splitRelayCPU(btotals[groupRelay], activity)
	res.Figure("pg_read_us_per_msg", perMsgMicros(split.read, ps.committed), "µs")
	res.Figure("pg_mark_us_per_msg", perMsgMicros(split.mark, ps.committed), "µs")
	res.Figure("pg_relay_us_per_msg", perMsgMicros(btotals[groupRelay], ps.committed), "µs")
	res.AddSeries("latency_ms", millis(lat))
	res.Check = c.report(ids)
	res.Finished = time.Now()
	if ps.missed > 0 {
		res.Note("the producer missed %d commits (every worker busy): raise -workers for the full rate", ps.missed)
	}
	return res, nil
}

// millis returns ds in milliseconds.
func millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}
