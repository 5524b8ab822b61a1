package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/bench/internal/result"
)

// system is the relay under test in a scenario: Ordo node processes or
// classic relay instances.
type system interface {
	// failed returns an error once a relay has died; nil while all run.
	failed() error
	// usage returns the relays' CPU so far and their largest peak RSS in
	// MiB; errors.ErrUnsupported for relays inside the bench process.
	usage() (cpu time.Duration, rssMiB float64, err error)
	// stop stops every relay and waits for them.
	stop() error
}

var (
	_ system = (*ordoSystem)(nil)
	_ system = (*classicSystem)(nil)
)

// systemSpec says which relay to run, and how many of it.
type systemSpec struct {
	classic bool
	n       int            // Ordo nodes or classic instances
	relay   classicPolling // classic: how the instances poll
	env     []string       // Ordo: extra ORDO_* variables for every node
	// onStart, when set, is called with every Ordo node right after its
	// process started (to move it into a CPU cgroup, say); an error stops
	// the start.
	onStart func(slot int, n *harness.Node) error
}

func ordo(n int) systemSpec { return systemSpec{n: n} }
func classic(n int, cl classicPolling) systemSpec {
	return systemSpec{classic: true, n: n, relay: cl}
}

// String is "ordo-3" or "classic-2".
func (s systemSpec) String() string {
	if s.classic {
		return fmt.Sprintf("classic-%d", s.n)
	}
	return fmt.Sprintf("ordo-%d", s.n)
}

// addParams records the relay in res, and marks a classic result as the
// baseline.
func (s systemSpec) addParams(res *result.Result) {
	if s.classic {
		res.Param("relay", "classic")
		res.Param("instances", s.n)
		res.Baseline = true
		return
	}
	res.Param("relay", "ordo")
	res.Param("nodes", s.n)
}

// start starts the relays on the rig and returns once they are ready:
// Ordo nodes converged on a map with every lease held, classic instances
// started (they connect on their own).
func (s systemSpec) start(ctx context.Context, r *harness.Rig) (system, error) {
	if s.classic {
		if err := classicIndex(ctx, r); err != nil {
			return nil, err
		}
		return startClassic(r, s.relay, s.n), nil
	}
	return startOrdoWith(ctx, r, s.n, s.env, s.onStart)
}

// addUsage adds the relays' CPU since cpu0 and peak RSS to res as
// node_cpu, node_cpu_per_1k_msgs and node_rss_peak, when measurable.
func addUsage(res *result.Result, sys system, cpu0 time.Duration, msgs int) error {
	cpu, rss, err := sys.usage()
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

// usageNow returns the relays' CPU so far, 0 when not measurable.
func usageNow(sys system) (time.Duration, error) {
	cpu, _, err := sys.usage()
	if errors.Is(err, errors.ErrUnsupported) {
		return 0, nil
	}
	return cpu, err
}

// ordoSystem is Ordo under test: n node processes, gossiping when n > 1.
type ordoSystem struct {
	c *harness.Cluster
}

// startOrdo starts n nodes and waits until they have converged (one node:
// until it holds every lease).
func startOrdo(ctx context.Context, r *harness.Rig, n int) (*ordoSystem, error) {
	return startOrdoWith(ctx, r, n, nil, nil)
}

// startOrdoWith is startOrdo with extra node environment and a hook
// called with every node right after it started (see cluster.onStart).
func startOrdoWith(ctx context.Context, r *harness.Rig, n int, env []string, onStart func(int, *harness.Node) error) (*ordoSystem, error) {
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
	return &ordoSystem{c: c}, nil
}

func (s *ordoSystem) failed() error { return s.c.Failed() }

// usage returns the nodes' CPU so far (summed) and the largest peak RSS.
func (s *ordoSystem) usage() (time.Duration, float64, error) {
	var cpu time.Duration
	var rss float64
	for _, n := range s.c.Nodes {
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

// readRows returns the rows the running nodes' relays have read so far
// (ordo_relay_read_rows_total, summed): the read path's amplification is
// this over the messages delivered.
func (s *ordoSystem) readRows(ctx context.Context) (float64, error) {
	var sum float64
	for _, n := range s.c.Nodes {
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

// stop stops every node (SIGTERM, in parallel) and waits for them.
func (s *ordoSystem) stop() error {
	errs := make(chan error, len(s.c.Nodes))
	for _, n := range s.c.Nodes {
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
	for range s.c.Nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
