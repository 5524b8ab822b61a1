package steady

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

const (
	// clusterSize is the node count of failover and join.
	clusterSize = 3
	// steadyBefore is how long the load runs on a converged cluster
	// before a kill or a join.
	steadyBefore = 2 * time.Second
	// eventTimeout bounds the wait for partitions to publish again after a
	// kill or a join: far above the targets, so a miss is measured, not cut.
	eventTimeout = 60 * time.Second
)

// clusterOptions are failover's and join's: -reps events on 3 nodes under
// a steady load, judged against a target.
type clusterOptions struct {
	measure.Common
	measure.KeyedTraffic
	Reps   int           // repetitions
	Target time.Duration // the target the figures are judged against
}

// FailoverOptions are failover's (-failover-target), JoinOptions join's
// (-join-target).
type (
	FailoverOptions struct{ clusterOptions }
	JoinOptions     struct{ clusterOptions }
)

func DefaultFailoverOptions() FailoverOptions {
	return FailoverOptions{clusterOptions{KeyedTraffic: measure.DefaultKeyedTraffic(), Reps: 3, Target: 3 * time.Second}}
}

func DefaultJoinOptions() JoinOptions {
	return JoinOptions{clusterOptions{KeyedTraffic: measure.DefaultKeyedTraffic(), Reps: 3, Target: 5 * time.Second}}
}

func (o *FailoverOptions) AddFlags(fs *flag.FlagSet) {
	o.clusterOptions.AddFlags(fs, "failover-target")
}
func (o *JoinOptions) AddFlags(fs *flag.FlagSet) { o.clusterOptions.AddFlags(fs, "join-target") }

func (o *clusterOptions) AddFlags(fs *flag.FlagSet, target string) {
	o.KeyedTraffic.AddFlags(fs)
	fs.IntVar(&o.Reps, "reps", o.Reps, "repetitions")
	fs.DurationVar(&o.Target, target, o.Target, "target")
}

func (o clusterOptions) Validate() error {
	var errs []error
	if o.Reps < 1 || o.Reps > 20 {
		errs = append(errs, fmt.Errorf("reps %d out of range 1..20", o.Reps))
	}
	return errors.Join(append(errs, o.KeyedTraffic.Validate())...)
}

// RunFailover measures failover: 3 gossiping nodes under a steady load of
// -rate commits a second (default 500; keys uniform over -keys, default
// 1000, so every key has many messages). Each of -reps repetitions waits
// until the cluster has converged, records the partitions the victim holds
// and their epochs from its /status, kills it with SIGKILL, and measures
// the seconds from the kill until every one of those partitions has a
// delivered message with a higher x-ordo-epoch: its partitions publish
// again. It also reads when ordo_lease_audit shows a claim of each, and
// when a survivor logged the membership change. The victim is then started
// again (same name and gossip address) for the next repetition; victims
// rotate n1, n2, n3.
func RunFailover(ctx context.Context, o FailoverOptions, emit func(*result.Result)) error {
	res, err := failoverOnce(ctx, o)
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

// failoverRep is one repetition's figures, from the kill.
type failoverRep struct {
	victim     string
	partitions int
	detected   time.Duration // first survivor log of the membership change
	claimed    time.Duration // every partition claimed (lease audit)
	firstPub   time.Duration // the first of its partitions published again
	published  time.Duration // every partition published again
	lag        time.Duration // the most a first publish came after both its claim and its commit
	rejoined   time.Duration // victim restarted until converged again
}

func failoverOnce(ctx context.Context, o FailoverOptions) (*result.Result, error) {
	rate, keys := measure.OrDefault(o.Rate, 500), measure.OrDefault(o.Keys, 1000)
	res := result.New("failover")
	all := make([]int, clusterSize)
	for i := range all {
		all[i] = i
	}
	u, err := startUnderLoad(ctx, o.clusterOptions, "failover", res, rate, keys, all)
	defer u.Close()
	if err != nil {
		return nil, err
	}
	cl, c, p := u.cl, u.c, u.p

	var reps []failoverRep
	for rep := range o.Reps {
		fr, err := failoverRepOnce(ctx, cl, c, p, all, rep%clusterSize)
		if err != nil {
			return nil, fmt.Errorf("repetition %d: %w", rep+1, err)
		}
		fmt.Printf("failover %d: %s (%d partitions) killed; survivors noticed after %v, all claimed after %v, all publishing after %v; back in %v\n",
			rep+1, fr.victim, fr.partitions, fr.detected.Round(time.Millisecond), fr.claimed.Round(time.Millisecond),
			fr.published.Round(time.Millisecond), fr.rejoined.Round(time.Millisecond))
		reps = append(reps, fr)
	}

	ids, rss, err := u.end(ctx, o.Timeout)
	if err != nil {
		return nil, err
	}

	var worst, worstClaim time.Duration
	for i, fr := range reps {
		n := i + 1
		res.Seconds(fmt.Sprintf("rep%d_publish_again_seconds", n), fr.published)
		res.Seconds(fmt.Sprintf("rep%d_claimed_seconds", n), fr.claimed)
		res.Seconds(fmt.Sprintf("rep%d_first_publish_seconds", n), fr.firstPub)
		res.Seconds(fmt.Sprintf("rep%d_detected_seconds", n), fr.detected)
		res.Millis(fmt.Sprintf("rep%d_publish_after_claim_ms_max", n), fr.lag)
		res.Seconds(fmt.Sprintf("rep%d_rejoin_converged_seconds", n), fr.rejoined)
		res.Figure(fmt.Sprintf("rep%d_partitions", n), float64(fr.partitions), "")
		worst = max(worst, fr.published)
		worstClaim = max(worstClaim, fr.claimed)
	}
	res.Seconds("publish_again_seconds_max", worst)
	res.Seconds("claimed_seconds_max", worstClaim)
	res.Seconds("target_seconds", o.Target)
	u.figures(res, ids, rss)
	if worst > o.Target {
		res.Note("failover took %v, above the %v target", worst.Round(time.Millisecond), o.Target)
	}
	return res, nil
}

// failoverRepOnce kills slot victim once and restarts it.
func failoverRepOnce(ctx context.Context, cl *harness.Cluster, c *measure.Consumer, prod *measure.Producer, all []int, victim int) (failoverRep, error) {
	fr := failoverRep{victim: cl.Names[victim]}
	if _, _, err := cl.WaitConverged(ctx, all, harness.ConvergeTimeout); err != nil {
		return fr, err
	}
	if err := harness.Sleep(ctx, steadyBefore); err != nil {
		return fr, err
	}
	// The victim's partitions and epochs, from its own /status, in a
	// converged state (checked again, as a move could have slipped in).
	sts, why := cl.Converged(ctx, all)
	if why != "" {
		return fr, fmt.Errorf("cluster no longer converged before the kill: %s", why)
	}
	st := sts[slices.Index(all, victim)]
	held := map[int]int64{} // partition -> the victim's epoch
	for _, l := range st.Leases {
		if l.Owner == fr.victim && slices.Contains(st.Held, l.Partition) {
			held[l.Partition] = l.Epoch
		}
	}
	if len(held) == 0 {
		return fr, fmt.Errorf("%s holds no partition", fr.victim)
	}
	fr.partitions = len(held)
	survivors := slices.DeleteFunc(slices.Clone(all), func(i int) bool { return i == victim })

	killAt := time.Now()
	cl.Nodes[victim].Kill()
	var pubAt map[int]measure.EpochFirst
	err := harness.WaitUntil(ctx, eventTimeout, 10*time.Millisecond, fmt.Sprintf("%s's partitions to publish again", fr.victim), func() (bool, error) {
		for _, i := range survivors {
			if err := cl.Nodes[i].Failed(); err != nil {
				return false, err
			}
		}
		if err := c.Failed(); err != nil {
			return false, err
		}
		pubAt = map[int]measure.EpochFirst{}
		for p, e := range held {
			f, ok := c.FirstAbove(p, e)
			if !ok {
				return false, nil
			}
			pubAt[p] = f
		}
		return true, nil
	})
	if err != nil {
		return fr, err
	}
	for _, f := range pubAt {
		d := f.At.Sub(killAt)
		fr.published = max(fr.published, d)
		if fr.firstPub == 0 || d < fr.firstPub {
			fr.firstPub = d
		}
	}
	var claims map[int]time.Time
	err = harness.WaitUntil(ctx, eventTimeout, 20*time.Millisecond, "claims in ordo_lease_audit", func() (bool, error) {
		var err error
		claims, err = cl.ClaimTimes(ctx, held)
		return len(claims) == len(held), err
	})
	if err != nil {
		return fr, err
	}
	for _, at := range claims {
		fr.claimed = max(fr.claimed, at.Sub(killAt))
	}
	_, commits := prod.Snapshot()
	fr.lag = PublishLag(pubAt, claims, commits)
	for _, i := range survivors {
		if at, ok := cl.Nodes[i].LineAfter("membership changed", killAt); ok {
			if d := at.Sub(killAt); fr.detected == 0 || d < fr.detected {
				fr.detected = d
			}
		}
	}

	restartAt := time.Now()
	if _, err := cl.Start(ctx, victim); err != nil {
		return fr, err
	}
	_, at, err := cl.WaitConverged(ctx, all, harness.ConvergeTimeout)
	if err != nil {
		return fr, err
	}
	fr.rejoined = at.Sub(restartAt)
	return fr, nil
}

// PublishLag returns, over the partitions of first, the most that a
// partition's first delivery under its new epoch came after the later of
// the partition's claim and that message's commit: the relay's own delay,
// without the wait for the lease or for traffic.
func PublishLag(first map[int]measure.EpochFirst, claims map[int]time.Time, commits map[string]measure.CommitTimes) time.Duration {
	var worst time.Duration
	for p, f := range first {
		from := claims[p]
		if ct, ok := commits[f.ID]; ok && ct.Committed.After(from) {
			from = ct.Committed
		}
		if from.IsZero() {
			continue
		}
		worst = max(worst, f.At.Sub(from))
	}
	return worst
}

// startLoad starts a producer of rate commits a second over keys keys.
// stop ends it and waits for its transactions; it is idempotent and
// returns the producer's error.
func startLoad(ctx context.Context, r *harness.Rig, t measure.Traffic, partitions, rate, keys int) (stop func() error, p *measure.Producer, err error) {
	p, err = measure.NewProducer(measure.ProducerConfig{Rate: rate, Workers: t.Workers, Keys: keys, Payload: t.Payload, Exchange: r.Exchange}, r.Pool, partitions)
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(pctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	return stop, p, nil
}
