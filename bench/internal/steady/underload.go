package steady

import (
	"context"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// underLoad is what failover and join run their events on: clusterSize
// nodes of a rig of its own, a checking consumer, and a steady load of
// orders from a producer.
type underLoad struct {
	r        *harness.Rig
	c        *measure.Consumer
	cl       *harness.Cluster
	p        *measure.Producer
	stopLoad func() error
}

// startUnderLoad makes the rig of the scenario name, records o's parameters in res,
// starts the consumer and the nodes of slots first, waits until they have
// converged and starts the load: rate orders a second over keys. Close
// the underLoad whatever it returns.
func startUnderLoad(ctx context.Context, o clusterOptions, name string, res *result.Result, rate, keys int, first []int) (*underLoad, error) {
	u := &underLoad{}
	var err error
	if u.r, err = measure.NewRig(ctx, o.Common, name, int32(o.Workers+2)); err != nil {
		return u, err
	}
	res.Param("nodes", clusterSize)
	res.Param("reps", o.Reps)
	res.Param("rate", rate)
	res.Param("keys", keys)
	res.Param("partitions", o.Partitions)
	res.Param("rejoin_interval", harness.RejoinInterval)
	if u.c, err = measure.StartRigConsumer(ctx, u.r, false); err != nil {
		return u, err
	}
	if u.cl, err = harness.NewCluster(u.r, o.AMQPURL, clusterSize, true); err != nil {
		return u, err
	}
	for _, i := range first {
		if _, err := u.cl.Start(ctx, i); err != nil {
			return u, err
		}
	}
	if _, _, err := u.cl.WaitConverged(ctx, first, harness.ConvergeTimeout); err != nil {
		return u, err
	}
	u.stopLoad, u.p, err = startLoad(ctx, u.r, o.Traffic, o.Partitions, rate, keys)
	return u, err
}

// end stops the load, waits until the consumer has every committed
// message and nothing is pending, and stops the nodes. It returns the
// committed ids and the nodes' peak RSS (MiB).
func (u *underLoad) end(ctx context.Context, timeout time.Duration) (ids []string, rssMiB float64, err error) {
	if err := u.stopLoad(); err != nil {
		return nil, 0, err
	}
	ids, _ = u.p.Snapshot()
	if err := u.c.WaitAll(ctx, ids, timeout, u.cl.Failed); err != nil {
		return nil, 0, err
	}
	if _, err := u.r.WaitPending(ctx, u.cl.Failed, nil); err != nil {
		return nil, 0, err
	}
	sys := &measure.OrdoSystem{C: u.cl}
	if _, rssMiB, err = sys.Usage(); err != nil {
		return nil, 0, err
	}
	return ids, rssMiB, sys.Stop()
}

// figures adds the load's figures, the nodes' peak RSS and the check of
// the deliveries of ids to res, and finishes it.
func (u *underLoad) figures(res *result.Result, ids []string, rssMiB float64) {
	ps := u.p.Stats()
	res.Figure("msgs", float64(ps.Committed), "")
	res.Figure("achieved_rate", float64(ps.Committed)/ps.Elapsed.Seconds(), "msg/s")
	res.Figure("producer_missed", float64(ps.Missed), "")
	res.Figure("node_rss_peak", rssMiB, "MiB")
	res.Check = u.c.Report(ids)
	res.Finished = time.Now()
}

// Close stops the load, if it runs, and removes the rig.
func (u *underLoad) Close() {
	if u.stopLoad != nil {
		_ = u.stopLoad()
	}
	if u.r != nil {
		u.r.Close()
	}
}
