package steady

import (
	"context"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/measure"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// RunJoin measures scale-out: 2 gossiping nodes under a steady load of
// -rate commits a second (default 500, keys uniform over -keys, default
// 1000). Each of -reps repetitions waits until the two have converged,
// records every partition's epoch, starts the 3rd node, and measures the
// seconds from its process start, and separately from its "node started"
// log line, until the 3 nodes agree on a map with 3 owners, every lease is
// held by its owner, and the new node has published (a delivery with a
// higher x-ordo-epoch) on each of its partitions. The 3rd node then stops
// with SIGTERM for the next repetition.
func RunJoin(ctx context.Context, o JoinOptions, emit func(*result.Result)) error {
	res, err := joinOnce(ctx, o)
	if err != nil {
		return err
	}
	emit(res)
	return nil
}

// joinRep is one repetition's figures.
type joinRep struct {
	partitions  int           // the new node's partitions
	startedLine time.Duration // process start to its "node started" line
	converged   time.Duration // process start to the 3-node map agreed and leases held
	claimed     time.Duration // process start to its last claim (lease audit)
	published   time.Duration // process start to a publish on each of its partitions
	lag         time.Duration // the most a first publish came after both its claim and its commit
	waitTraffic time.Duration // process start to the commit of the last partition's first message
	done        time.Duration // max(converged, published)
}

func joinOnce(ctx context.Context, o JoinOptions) (*result.Result, error) {
	rate, keys := measure.OrDefault(o.Rate, 500), measure.OrDefault(o.Keys, 1000)
	res := result.New("join")
	two, all := []int{0, 1}, []int{0, 1, 2}
	u, err := startUnderLoad(ctx, o.clusterOptions, "join", res, rate, keys, two)
	defer u.Close()
	if err != nil {
		return nil, err
	}
	cl, c, p := u.cl, u.c, u.p

	var reps []joinRep
	for rep := range o.Reps {
		jr, err := joinRepOnce(ctx, cl, c, p, two, all)
		if err != nil {
			return nil, fmt.Errorf("repetition %d: %w", rep+1, err)
		}
		fmt.Printf("join %d: n3 (%d partitions) logged \"node started\" after %v, converged after %v, published on all after %v\n",
			rep+1, jr.partitions, jr.startedLine.Round(time.Millisecond), jr.converged.Round(time.Millisecond), jr.published.Round(time.Millisecond))
		reps = append(reps, jr)
		if rep < o.Reps-1 {
			if _, err := cl.Nodes[2].Stop(harness.NodeStopTimeout); err != nil {
				return nil, err
			}
		}
	}

	ids, rss, err := u.end(ctx, o.Timeout)
	if err != nil {
		return nil, err
	}

	var worst, worstFromLine time.Duration
	for i, jr := range reps {
		n := i + 1
		res.Seconds(fmt.Sprintf("rep%d_join_seconds", n), jr.done)
		res.Seconds(fmt.Sprintf("rep%d_join_from_started_line_seconds", n), jr.done-jr.startedLine)
		res.Seconds(fmt.Sprintf("rep%d_started_line_seconds", n), jr.startedLine)
		res.Seconds(fmt.Sprintf("rep%d_converged_seconds", n), jr.converged)
		res.Seconds(fmt.Sprintf("rep%d_claimed_seconds", n), jr.claimed)
		res.Seconds(fmt.Sprintf("rep%d_published_seconds", n), jr.published)
		res.Millis(fmt.Sprintf("rep%d_publish_after_claim_ms_max", n), jr.lag)
		res.Seconds(fmt.Sprintf("rep%d_last_first_msg_committed_seconds", n), jr.waitTraffic)
		res.Figure(fmt.Sprintf("rep%d_partitions", n), float64(jr.partitions), "")
		worst = max(worst, jr.done)
		worstFromLine = max(worstFromLine, jr.done-jr.startedLine)
	}
	res.Seconds("join_seconds_max", worst)
	res.Seconds("join_from_started_line_seconds_max", worstFromLine)
	res.Seconds("target_seconds", o.Target)
	u.figures(res, ids, rss)
	if worst > o.Target {
		res.Note("joining took %v, above the %v target", worst.Round(time.Millisecond), o.Target)
	}
	return res, nil
}

// joinRepOnce starts slot 2 once next to the converged slots two.
func joinRepOnce(ctx context.Context, cl *harness.Cluster, c *measure.Consumer, prod *measure.Producer, two, all []int) (joinRep, error) {
	var jr joinRep
	if _, _, err := cl.WaitConverged(ctx, two, harness.ConvergeTimeout); err != nil {
		return jr, err
	}
	if err := harness.Sleep(ctx, steadyBefore); err != nil {
		return jr, err
	}
	sts, why := cl.Converged(ctx, two)
	if why != "" {
		return jr, fmt.Errorf("the two nodes no longer converged before the join: %s", why)
	}
	before := sts[0].Epochs()

	n3, err := cl.Start(ctx, 2)
	if err != nil {
		return jr, err
	}
	startAt := n3.Started
	var convergedAt time.Time
	var mine map[int]int64 // n3's partitions -> epoch before the join
	var pubAt time.Time
	var firsts map[int]measure.EpochFirst
	err = harness.WaitUntil(ctx, eventTimeout, harness.ConvergePoll, "n3 to converge and publish on its partitions", func() (bool, error) {
		if err := cl.Failed(); err != nil {
			return false, err
		}
		if err := c.Failed(); err != nil {
			return false, err
		}
		if convergedAt.IsZero() {
			sts, why := cl.Converged(ctx, all)
			if why != "" {
				return false, nil
			}
			convergedAt = time.Now()
			mine = map[int]int64{}
			for _, p := range sts[0].Assigned(cl.Names[2]) {
				mine[p] = before[p]
			}
		}
		pubAt = time.Time{}
		firsts = map[int]measure.EpochFirst{}
		for p, e := range mine {
			f, ok := c.FirstAbove(p, e)
			if !ok {
				return false, nil
			}
			firsts[p] = f
			pubAt = MaxTime(pubAt, f.At)
		}
		return true, nil
	})
	if err != nil {
		return jr, err
	}
	jr.partitions = len(mine)
	jr.converged = convergedAt.Sub(startAt)
	jr.published = pubAt.Sub(startAt)
	jr.done = max(jr.converged, jr.published)
	if at, ok := n3.LineAfter("node started", startAt); ok {
		jr.startedLine = at.Sub(startAt)
	}
	claims, err := cl.ClaimTimes(ctx, mine)
	if err != nil {
		return jr, err
	}
	for _, at := range claims {
		jr.claimed = max(jr.claimed, at.Sub(startAt))
	}
	_, commits := prod.Snapshot()
	jr.lag = PublishLag(firsts, claims, commits)
	for _, f := range firsts {
		if ct, ok := commits[f.ID]; ok {
			jr.waitTraffic = max(jr.waitTraffic, ct.Committed.Sub(startAt))
		}
	}
	return jr, nil
}

func MaxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
