package main

import (
	"context"
	"fmt"
	"time"
)

// runLatency measures commit-to-delivery latency. Producers commit -rate
// rows a second (default 1000, one row per transaction, keys drawn from
// -keys, default 10000) for -duration (30 s), paced by a ticker. Latency
// is the consumer's receive time minus the time the producer's COMMIT
// returned, both on the bench's clock; commits in the first -warmup (2 s)
// are not measured.
func runLatency(ctx context.Context, o options) (*Result, error) {
	rate, keys := o.rateOr(1000), o.keysOr(10000)
	r, err := newRig(ctx, o, "latency", int32(o.Workers+2))
	if err != nil {
		return nil, err
	}
	defer r.close()
	res := newResult("latency")
	res.Param("nodes", 1)
	res.Param("rate", rate)
	res.Param("keys", keys)
	res.Param("workers", o.Workers)
	res.Param("duration", o.Duration)
	res.Param("warmup", o.Warmup)
	res.Param("partitions", o.Partitions)
	res.Param("confirm_window", o.ConfirmWindow)

	c, err := r.startConsumer(ctx)
	if err != nil {
		return nil, err
	}
	n, err := r.startNode(ctx, o.AMQPURL)
	if err != nil {
		return nil, err
	}
	if err := n.waitReady(ctx, min(o.Timeout, time.Minute)); err != nil {
		return nil, err
	}
	p, err := newProducer(producerConfig{Rate: rate, Workers: o.Workers, Keys: keys, Payload: o.Payload, Exchange: r.exchange}, r.pool, o.Partitions)
	if err != nil {
		return nil, err
	}
	nodeCPU0, err := n.cpu()
	if err != nil {
		return nil, err
	}
	cpu0 := sampleCPU()
	act := startActivity(r.pool, r.name)
	fmt.Printf("producing %d msg/s for %v\n", rate, o.Duration)
	pctx, cancel := context.WithTimeout(ctx, o.Duration)
	err = p.run(pctx) // returns when pctx ends, with every transaction finished
	cancel()
	activity := act.stop()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cpu1 := sampleCPU()
	nodeCPU1, err := n.cpu()
	if err != nil {
		return nil, err
	}
	ids, commits := p.snapshot()
	if err := c.waitAll(ctx, ids, o.Timeout, n.failed); err != nil {
		return nil, err
	}
	if _, err := r.waitPending(ctx, n); err != nil {
		return nil, err
	}
	rss, err := n.peakRSSMiB()
	if err != nil {
		return nil, err
	}
	if _, err := n.stop(nodeStopTimeout); err != nil {
		return nil, err
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
	ps := p.stats()
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
	res.Figure("node_rss_peak", rss, "MiB")
	nodeCPU := nodeCPU1 - nodeCPU0
	res.Seconds("node_cpu", nodeCPU)
	res.Figure("node_cpu_per_1k_msgs", 1000*nodeCPU.Seconds()/float64(max(1, ps.committed)), "s")
	addCPU(res, cpu0, cpu1, "")
	activity.addTo(res)
	res.Check = c.report(ids)
	res.Finished = time.Now()
	if ps.missed > 0 {
		res.Note("the producer missed %d commits (every worker busy): raise -workers for the full rate", ps.missed)
	}
	return res, nil
}
