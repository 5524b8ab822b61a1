package measure

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// System is the relay under test in a scenario: Ordo node processes or
// classic relay instances.
type System interface {
	// Failed returns an error once a relay has died; nil while all run.
	Failed() error
	// Usage returns the relays' CPU so far and their largest peak RSS in
	// MiB; errors.ErrUnsupported for relays inside the bench process.
	Usage() (cpu time.Duration, rssMiB float64, err error)
	// Stop stops every relay and waits for them.
	Stop() error
}

var (
	_ System = (*OrdoSystem)(nil)
	_ System = (*ClassicSystem)(nil)
)

// SystemSpec says which relay to run, and how many of it.
type SystemSpec struct {
	Classic bool
	N       int            // Ordo nodes or classic instances
	Relay   ClassicPolling // classic: how the instances poll
	Env     []string       // Ordo: extra ORDO_* variables for every node
	// OnStart, when set, is called with every Ordo node right after its
	// process started (to move it into a CPU cgroup, say); an error stops
	// the start.
	OnStart func(slot int, n *harness.Node) error
}

func Ordo(n int) SystemSpec { return SystemSpec{N: n} }
func Classic(n int, cl ClassicPolling) SystemSpec {
	return SystemSpec{Classic: true, N: n, Relay: cl}
}

// String is "ordo-3" or "classic-2".
func (s SystemSpec) String() string {
	if s.Classic {
		return fmt.Sprintf("classic-%d", s.N)
	}
	return fmt.Sprintf("ordo-%d", s.N)
}

// AddParams records the relay in res, and marks a classic result as the
// baseline.
func (s SystemSpec) AddParams(res *result.Result) {
	if s.Classic {
		res.Param("relay", "classic")
		res.Param("instances", s.N)
		res.Baseline = true
		return
	}
	res.Param("relay", "ordo")
	res.Param("nodes", s.N)
}

// Start starts the relays on the rig and returns once they are ready:
// Ordo nodes converged on a map with every lease held, classic instances
// started (they connect on their own).
func (s SystemSpec) Start(ctx context.Context, r *harness.Rig) (System, error) {
	if s.Classic {
		if err := classicIndex(ctx, r); err != nil {
			return nil, err
		}
		return startClassic(r, s.Relay, s.N), nil
	}
	return startOrdoWith(ctx, r, s.N, s.Env, s.OnStart)
}

// AddUsage adds the relays' CPU since cpu0 and peak RSS to res as
// node_cpu, node_cpu_per_1k_msgs and node_rss_peak, when measurable.
func AddUsage(res *result.Result, sys System, cpu0 time.Duration, msgs int) error {
	cpu, rss, err := sys.Usage()
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return err
	}
	res.Figure("node_rss_peak", rss, "MiB")
	res.Seconds("node_cpu", cpu-cpu0)
	res.Figure("node_cpu_per_1k_msgs", 1000*(cpu-cpu0).Seconds()/float64(max(1, msgs)), "s")
	return nil
}

// UsageNow returns the relays' CPU so far, 0 when not measurable.
func UsageNow(sys System) (time.Duration, error) {
	cpu, _, err := sys.Usage()
	if errors.Is(err, errors.ErrUnsupported) {
		return 0, nil
	}
	return cpu, err
}

// OrdoSystem is Ordo under test: n node processes, gossiping when n > 1.
type OrdoSystem struct {
	C *harness.Cluster
}

// startOrdo starts n nodes and waits until they have converged (one node:
// until it holds every lease).
func startOrdo(ctx context.Context, r *harness.Rig, n int) (*OrdoSystem, error) {
	return startOrdoWith(ctx, r, n, nil, nil)
}

// startOrdoWith is startOrdo with extra node environment and a hook
// called with every node right after it started (see cluster.OnStart).
func startOrdoWith(ctx context.Context, r *harness.Rig, n int, env []string, onStart func(int, *harness.Node) error) (*OrdoSystem, error) {
	c, err := harness.NewCluster(r, r.Config.AMQPURL, n, n > 1)
	if err != nil {
		return nil, err
	}
	c.Env, c.OnStart = env, onStart
	for i := range n {
		if _, err := c.Start(ctx, i); err != nil {
			return nil, err
		}
	}
	all := c.Running()
	if _, _, err := c.WaitConverged(ctx, all, min(r.Config.Timeout, harness.ConvergeTimeout)); err != nil {
		return nil, err
	}
	return &OrdoSystem{C: c}, nil
}

func (s *OrdoSystem) Failed() error { return s.C.Failed() }

// Usage returns the nodes' CPU so far (summed) and the largest peak RSS.
func (s *OrdoSystem) Usage() (time.Duration, float64, error) {
	var cpu time.Duration
	var rss float64
	for _, n := range s.C.Nodes {
		if n == nil || n.Exited() {
			continue
		}
		t, err := n.CPU()
		if err != nil {
			return 0, 0, err
		}
		m, err := n.PeakRSSMiB()
		if err != nil {
			return 0, 0, err
		}
		cpu += t
		rss = max(rss, m)
	}
	return cpu, rss, nil
}

// ReadRows returns the rows the running nodes' relays have read so far
// (ordo_relay_read_rows_total, summed): the read path's amplification is
// this over the messages delivered.
func (s *OrdoSystem) ReadRows(ctx context.Context) (float64, error) {
	var sum float64
	for _, n := range s.C.Nodes {
		if n == nil || n.Exited() {
			continue
		}
		v, found, err := n.Metric(ctx, "ordo_relay_read_rows_total")
		if err != nil {
			return 0, err
		}
		if !found {
			return 0, fmt.Errorf("node %s: no ordo_relay_read_rows_total on its /metrics", n.Name)
		}
		sum += v
	}
	return sum, nil
}

// Stop stops every node (SIGTERM, in parallel) and waits for them.
func (s *OrdoSystem) Stop() error {
	errs := make(chan error, len(s.C.Nodes))
	for _, n := range s.C.Nodes {
		go func() {
			if n == nil {
				errs <- nil
				return
			}
			_, err := n.Stop(harness.NodeStopTimeout)
			errs <- err
		}()
	}
	var all []error
	for range s.C.Nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// Delivered waits until c has received every message p committed and the
// rig's outbox has none pending, then stops sys; a classic system adds its
// totals to res. It returns p's snapshot: the ids and their commit times.
func Delivered(ctx context.Context, r *harness.Rig, c *Consumer, p *Producer, sys System, res *result.Result, timeout time.Duration) ([]string, map[string]CommitTimes, error) {
	ids, commits := p.Snapshot()
	if err := c.WaitAll(ctx, ids, timeout, sys.Failed); err != nil {
		return nil, nil, err
	}
	if _, err := r.WaitPending(ctx, sys.Failed, nil); err != nil {
		return nil, nil, err
	}
	if err := sys.Stop(); err != nil {
		return nil, nil, err
	}
	if cs, ok := sys.(*ClassicSystem); ok {
		cs.AddTo(res)
	}
	return ids, commits, nil
}
