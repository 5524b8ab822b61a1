package steady

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/result"
)

// LatencyOptions are latency's: a steady load for -duration.
type LatencyOptions struct {
	measure.Common
	measure.KeyedTraffic
	Duration time.Duration // how long producers run
	Warmup   time.Duration // commits in this first part are not measured
	Lean     bool          // the producers' key_seq trigger dropped once the node runs (Ordo's runs)
}

func DefaultLatencyOptions() LatencyOptions {
	return LatencyOptions{KeyedTraffic: measure.DefaultKeyedTraffic(), Duration: 30 * time.Second, Warmup: 2 * time.Second}
}

func (o *LatencyOptions) AddFlags(fs *flag.FlagSet) {
	o.addSteadyFlags(fs)
	fs.BoolVar(&o.Lean, "lean", o.Lean, "drop the producers' key_seq trigger once the node runs (outbox.DropKeySeqTrigger): the rows arrive without key_seq and the partition owner numbers them")
}

// addSteadyFlags adds the flags latency shares with classic-latency.
func (o *LatencyOptions) addSteadyFlags(fs *flag.FlagSet) {
	o.KeyedTraffic.AddFlags(fs)
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long producers run")
	WarmupVar(fs, &o.Warmup)
}

func WarmupVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "warmup", *p, "commits in this first part of a run are not measured")
}

func (o LatencyOptions) Validate() error {
	var errs []error
	switch {
	case o.Duration <= 0 || o.Warmup < 0:
		errs = append(errs, errors.New("duration must be positive and warmup not negative"))
	case o.Warmup >= o.Duration:
		errs = append(errs, fmt.Errorf("warmup %v must be shorter than duration %v", o.Warmup, o.Duration))
	}
	return errors.Join(append(errs, o.KeyedTraffic.Validate())...)
}

// ClassicLatencyOptions are classic-latency's: latency's, through the
// classic relay on the first count of -instances.
type ClassicLatencyOptions struct {
	LatencyOptions
	measure.ClassicPolling
	Instances []int // the first is the instance count
}

func DefaultClassicLatencyOptions() ClassicLatencyOptions {
	return ClassicLatencyOptions{LatencyOptions: DefaultLatencyOptions(), ClassicPolling: measure.DefaultClassicPolling(), Instances: []int{1}}
}

func (o *ClassicLatencyOptions) AddFlags(fs *flag.FlagSet) {
	o.addSteadyFlags(fs)
	o.ClassicPolling.AddFlags(fs)
	measure.CountsVar(fs, "instances", &o.Instances, "classic instances: the first of these comma-separated counts")
}

func (o ClassicLatencyOptions) Validate() error {
	return errors.Join(o.LatencyOptions.Validate(), o.ClassicPolling.Validate())
}

// RunLatency measures Ordo's commit-to-delivery latency with one node:
// see LatencyOnce.
func RunLatency(ctx context.Context, o LatencyOptions, emit func(*result.Result)) error {
	res, err := LatencyOnce(ctx, o, measure.Ordo(1))
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

// RunClassicLatency measures the classic relay's latency the same way,
// with the first count of -instances (default 1).
func RunClassicLatency(ctx context.Context, o ClassicLatencyOptions, emit func(*result.Result)) error {
	res, err := LatencyOnce(ctx, o.LatencyOptions, measure.Classic(o.Instances[0], o.ClassicPolling))
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

// LatencyOnce measures commit-to-delivery latency through the relays of
// spec. Producers commit -rate rows a second (default 1000, one row per
// transaction, keys drawn from -keys, default 10000) for -duration (30 s),
// paced by a ticker. Latency is the consumer's receive time minus the time
// the producer's COMMIT returned, both on the bench's clock; commits in
// the first -warmup (2 s) are not measured.
func LatencyOnce(ctx context.Context, o LatencyOptions, spec measure.SystemSpec) (*result.Result, error) {
	rate, keys := measure.OrDefault(o.Rate, 1000), measure.OrDefault(o.Keys, 10000)
	name := "latency"
	if spec.Classic {
		name = "classic-latency"
	}
	r, err := measure.NewRig(ctx, o.Common, name, int32(o.Workers+2))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	res := result.New(name)
	res.Label = spec.String()
	spec.AddParams(res)
	res.Param("rate", rate)
	res.Param("keys", keys)
	res.Param("workers", o.Workers)
	res.Param("duration", o.Duration)
	res.Param("warmup", o.Warmup)
	res.Param("partitions", o.Partitions)
	if spec.Classic {
		res.Param("batch", spec.Relay.ClassicBatch)
		res.Param("interval", spec.Relay.ClassicEvery)
	} else {
		res.Param("confirm_window", o.ConfirmWindow)
	}

	c, err := measure.StartRigConsumer(ctx, r, false)
	if err != nil {
		return nil, err
	}
	sys, err := spec.Start(ctx, r)
	if err != nil {
		return nil, err
	}
	if o.Lean && !spec.Classic {
		res.Param("lean", true)
		if err := measure.DropKeySeqTrigger(ctx, r); err != nil {
			return nil, err
		}
	}
	p, err := measure.NewProducer(measure.ProducerConfig{Rate: rate, Workers: o.Workers, Keys: keys, Payload: o.Payload, Exchange: r.Exchange}, r.Pool, o.Partitions)
	if err != nil {
		return nil, err
	}
	relayCPU0, err := measure.UsageNow(sys)
	if err != nil {
		return nil, err
	}
	cpu0 := measure.SampleCPU()
	act := measure.StartActivity(r.Probe, r.Name)
	backends, err := measure.StartBackendCPU(ctx, r.Probe, r.Name)
	if err != nil {
		act.Stop()
		return nil, err
	}
	fmt.Printf("producing %d msg/s for %v\n", rate, o.Duration)
	pctx, cancel := context.WithTimeout(ctx, o.Duration)
	err = p.Run(pctx) // returns when pctx ends, with every transaction finished
	cancel()
	activity := act.Stop()
	btotals, berr := backends.Stop(ctx)
	if err != nil {
		return nil, err
	}
	if berr != nil {
		res.Note("backend CPU sampling: %v", berr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cpu1 := measure.SampleCPU()
	ps := p.Stats()
	if err := measure.AddUsage(res, sys, relayCPU0, ps.Committed); err != nil {
		return nil, err
	}
	ids, commits, err := measure.Delivered(ctx, r, c, p, sys, res, o.Timeout)
	if err != nil {
		return nil, err
	}

	recv := c.ReceiveTimes()
	from := p.StartedAt().Add(o.Warmup)
	var lat, fromSent, tx, commit []time.Duration
	early := 0
	for _, id := range ids {
		ct := commits[id]
		if ct.Begun.Before(from) {
			continue
		}
		d := recv[id].Sub(ct.Committed)
		if d < 0 {
			early++ // delivered before the producer saw its COMMIT return
		}
		lat = append(lat, d)
		fromSent = append(fromSent, recv[id].Sub(ct.Sent))
		tx = append(tx, ct.Committed.Sub(ct.Begun))
		commit = append(commit, ct.Committed.Sub(ct.Sent))
	}
	res.Figure("msgs", float64(ps.Committed), "")
	res.Figure("measured", float64(len(lat)), "")
	res.Figure("achieved_rate", float64(ps.Committed)/ps.Elapsed.Seconds(), "msg/s")
	measure.DistributionOf(lat).AddTo(res, "latency")
	ds := measure.DistributionOf(fromSent)
	res.Millis("latency_from_commit_sent_p50", ds.P50)
	res.Millis("latency_from_commit_sent_p99", ds.P99)
	dt := measure.DistributionOf(tx)
	res.Millis("tx_p50", dt.P50)
	res.Millis("tx_p99", dt.P99)
	dc := measure.DistributionOf(commit)
	res.Millis("commit_p50", dc.P50)
	res.Millis("commit_p99", dc.P99)
	res.Figure("delivered_before_commit_returned", float64(early), "")
	res.Figure("producer_missed", float64(ps.Missed), "")
	res.Figure("producer_errors", float64(ps.Errors), "")
	measure.AddCPU(res, cpu0, cpu1, "")
	activity.AddTo(res)
	// The producers' backends (the bench pool) during the run: the
	// single-row insert and its commit, NOTIFY included.
	res.Figure("pg_insert_us_per_msg", measure.PerMsgMicros(btotals[measure.GroupBench], ps.Committed), "µs")
	split := measure.SplitRelayCPU(btotals[measure.GroupRelay], activity)
	res.Figure("pg_read_us_per_msg", measure.PerMsgMicros(split.Read, ps.Committed), "µs")
	res.Figure("pg_mark_us_per_msg", measure.PerMsgMicros(split.Mark, ps.Committed), "µs")
	res.Figure("pg_relay_us_per_msg", measure.PerMsgMicros(btotals[measure.GroupRelay], ps.Committed), "µs")
	res.AddSeries("latency_ms", millis(lat))
	res.Check = c.Report(ids)
	res.Finished = time.Now()
	if ps.Missed > 0 {
		res.Note("the producer missed %d commits (every worker busy): raise -workers for the full rate", ps.Missed)
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
