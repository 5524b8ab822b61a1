package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

const (
	// statusTimeout bounds one GET /status.
	statusTimeout = 2 * time.Second
	// convergePoll is how often convergence is checked.
	convergePoll = 50 * time.Millisecond
	// convergeTimeout bounds a wait for convergence.
	convergeTimeout = time.Minute
	// rejoinInterval is the nodes' ORDO_REJOIN_INTERVAL.
	rejoinInterval = "1s"
)

// cluster is a set of node slots n1..nN on the rig's database. Each slot
// has a fixed name and gossip address, so a node killed and started again
// comes back as the same member; every node lists every slot's gossip
// address as a seed, started or not. With gossip off (one node) the node
// runs alone and owns every partition. Gossip is encrypted with a key
// drawn for the run, as a real cluster's would be.
type cluster struct {
	r         *rig
	amqpURL   string
	gossip    bool
	gossipKey string // base64, shared by every slot
	names     []string
	addrs     []string // gossip addresses
	nodes     []*node  // the current process of each slot; nil before its first start
	client    *http.Client
	env       []string                      // extra ORDO_* variables for every node
	onStart   func(slot int, n *node) error // called right after a node's process started; may be nil
}

// newCluster prepares size slots. Nothing is started yet.
func newCluster(r *rig, amqpURL string, size int, gossip bool) (*cluster, error) {
	c := &cluster{r: r, amqpURL: amqpURL, gossip: gossip, nodes: make([]*node, size),
		client: &http.Client{Timeout: statusTimeout}}
	if gossip {
		key := make([]byte, 32)
		rand.Read(key) // never fails (crypto/rand crashes the program instead)
		c.gossipKey = base64.StdEncoding.EncodeToString(key)
	}
	for i := range size {
		c.names = append(c.names, fmt.Sprintf("n%d", i+1))
		if gossip {
			a, err := freeAddr()
			if err != nil {
				return nil, err
			}
			c.addrs = append(c.addrs, a)
		}
	}
	return c, nil
}

// start starts slot i's node (again, if it ran before and has exited).
func (c *cluster) start(ctx context.Context, i int) (*node, error) {
	if n := c.nodes[i]; n != nil && !n.exited() {
		return nil, fmt.Errorf("start %s: still running", c.names[i])
	}
	var env []string
	if c.gossip {
		env = []string{
			"ORDO_GOSSIP_ADDR=" + c.addrs[i],
			"ORDO_JOIN=" + strings.Join(c.addrs, ","),
			"ORDO_GOSSIP_KEY=" + c.gossipKey,
			"ORDO_REJOIN_INTERVAL=" + rejoinInterval,
		}
	}
	n, err := c.r.startNamedNode(ctx, c.names[i], c.amqpURL, append(env, c.env...)...)
	if err != nil {
		return nil, err
	}
	c.nodes[i] = n
	if c.onStart != nil {
		if err := c.onStart(i, n); err != nil {
			n.kill()
			return nil, fmt.Errorf("start %s: %w", c.names[i], err)
		}
	}
	return n, nil
}

// running returns the slots whose node runs.
func (c *cluster) running() []int {
	var out []int
	for i, n := range c.nodes {
		if n != nil && !n.exited() {
			out = append(out, i)
		}
	}
	return out
}

// failed returns the first error of a node that exited without being
// stopped or killed.
func (c *cluster) failed() error {
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		if err := n.failed(); err != nil {
			return err
		}
	}
	return nil
}

// nodeStatus is the part of a node's /status the bench reads.
type nodeStatus struct {
	Node       string        `json:"node"`
	Held       []int         `json:"held"`
	Assignment []string      `json:"assignment"` // owner by partition, in this node's view
	Leases     []leaseStatus `json:"partitions"` // what the database says
}

type leaseStatus struct {
	Partition int    `json:"partition"`
	Owner     string `json:"owner"`
	Epoch     int64  `json:"epoch"`
}

// epochs returns the lease epoch of every partition.
func (s nodeStatus) epochs() map[int]int64 {
	m := make(map[int]int64, len(s.Leases))
	for _, l := range s.Leases {
		m[l.Partition] = l.Epoch
	}
	return m
}

// assigned returns the partitions the map gives to name.
func (s nodeStatus) assigned(name string) []int {
	var out []int
	for p, o := range s.Assignment {
		if o == name {
			out = append(out, p)
		}
	}
	return out
}

// status fetches slot i's /status.
func (c *cluster) status(ctx context.Context, i int) (nodeStatus, error) {
	var st nodeStatus
	n := c.nodes[i]
	if n == nil {
		return st, fmt.Errorf("status of %s: not started", c.names[i])
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.httpAddr+"/status", nil)
	if err != nil {
		return st, fmt.Errorf("status of %s: %w", c.names[i], err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return st, fmt.Errorf("status of %s: %w", c.names[i], err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status of %s: %s", c.names[i], resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("status of %s: decode: %w", c.names[i], err)
	}
	return st, nil
}

// converged checks that the nodes of slots want agree: every one's map is
// the same, its owners are exactly those nodes, and the database's lease
// owner of every partition is the owner the map says. It returns the
// statuses, and why not when they do not agree ("" when they do). A node
// that does not answer is a reason, not an error.
func (c *cluster) converged(ctx context.Context, want []int) ([]nodeStatus, string) {
	sts := make([]nodeStatus, 0, len(want))
	names := map[string]bool{}
	for _, i := range want {
		names[c.names[i]] = true
	}
	for _, i := range want {
		st, err := c.status(ctx, i)
		if err != nil {
			return nil, err.Error()
		}
		if len(sts) > 0 && !slices.Equal(sts[0].Assignment, st.Assignment) {
			return nil, fmt.Sprintf("%s's map differs from %s's", c.names[i], sts[0].Node)
		}
		owners := map[string]bool{}
		for _, o := range st.Assignment {
			owners[o] = true
		}
		if len(owners) != len(names) {
			return nil, fmt.Sprintf("%s's map has %d owners, want %d", c.names[i], len(owners), len(names))
		}
		for o := range owners {
			if !names[o] {
				return nil, fmt.Sprintf("%s's map names %s", c.names[i], o)
			}
		}
		for _, l := range st.Leases {
			if l.Partition >= len(st.Assignment) || l.Owner != st.Assignment[l.Partition] {
				return nil, fmt.Sprintf("partition %d: lease held by %q", l.Partition, l.Owner)
			}
		}
		sts = append(sts, st)
	}
	return sts, ""
}

// waitConverged polls converged until it holds and returns the statuses
// and when agreement was first seen. A node exiting is an error.
func (c *cluster) waitConverged(ctx context.Context, want []int, timeout time.Duration) ([]nodeStatus, time.Time, error) {
	var sts []nodeStatus
	var at time.Time
	var why string
	err := waitUntil(ctx, timeout, convergePoll, fmt.Sprintf("%d nodes to converge", len(want)), func() (bool, error) {
		if err := c.failed(); err != nil {
			return false, err
		}
		sts, why = c.converged(ctx, want)
		at = time.Now()
		return why == "", nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%w (last: %s)", err, why)
	}
	return sts, at, nil
}

// claimTimes returns, for each partition p in epochs, when the first
// lease claim of p at an epoch above epochs[p] was recorded in
// ordo_lease_audit (the database's clock, which is the bench's: same
// machine). Partitions without such a claim yet are missing from the map.
func (c *cluster) claimTimes(ctx context.Context, epochs map[int]int64) (map[int]time.Time, error) {
	ps := make([]int32, 0, len(epochs))
	es := make([]int64, 0, len(epochs))
	for p, e := range epochs {
		ps = append(ps, int32(p))
		es = append(es, e)
	}
	rows, err := c.r.pool.Query(ctx, sqlClaimTimes, ps, es)
	if err != nil {
		return nil, fmt.Errorf("read lease claims: %w", err)
	}
	defer rows.Close()
	out := map[int]time.Time{}
	for rows.Next() {
		var p int32
		var at time.Time
		if err := rows.Scan(&p, &at); err != nil {
			return nil, fmt.Errorf("read lease claims: %w", err)
		}
		out[int(p)] = at
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read lease claims: %w", err)
	}
	return out, nil
}

// sqlClaimTimes: the first claim of each partition $1[i] above epoch $2[i].
const sqlClaimTimes = `
SELECT h.p, min(a.at)
FROM unnest($1::int[], $2::bigint[]) AS h(p, e)
JOIN ordo_lease_audit AS a ON a.partition = h.p AND a.epoch > h.e AND a.event = 'claim'
GROUP BY h.p`

// ordoSystem is Ordo under test: n node processes, gossiping when n > 1.
type ordoSystem struct {
	c *cluster
}

// startOrdo starts n nodes and waits until they have converged (one node:
// until it holds every lease).
func startOrdo(ctx context.Context, r *rig, n int) (*ordoSystem, error) {
	return startOrdoWith(ctx, r, n, nil, nil)
}

// startOrdoWith is startOrdo with extra node environment and a hook
// called with every node right after it started (see cluster.onStart).
func startOrdoWith(ctx context.Context, r *rig, n int, env []string, onStart func(int, *node) error) (*ordoSystem, error) {
	c, err := newCluster(r, r.o.AMQPURL, n, n > 1)
	if err != nil {
		return nil, err
	}
	c.env, c.onStart = env, onStart
	for i := range n {
		if _, err := c.start(ctx, i); err != nil {
			return nil, err
		}
	}
	all := c.running()
	if _, _, err := c.waitConverged(ctx, all, min(r.o.Timeout, convergeTimeout)); err != nil {
		return nil, err
	}
	return &ordoSystem{c: c}, nil
}

func (s *ordoSystem) failed() error { return s.c.failed() }

// usage returns the nodes' CPU so far (summed) and the largest peak RSS.
func (s *ordoSystem) usage() (time.Duration, float64, error) {
	var cpu time.Duration
	var rss float64
	for _, n := range s.c.nodes {
		if n == nil || n.exited() {
			continue
		}
		t, err := n.cpu()
		if err != nil {
			return 0, 0, err
		}
		m, err := n.peakRSSMiB()
		if err != nil {
			return 0, 0, err
		}
		cpu += t
		rss = max(rss, m)
	}
	return cpu, rss, nil
}

// stop stops every node (SIGTERM, in parallel) and waits for them.
func (s *ordoSystem) stop() error {
	errs := make(chan error, len(s.c.nodes))
	for _, n := range s.c.nodes {
		go func() {
			if n == nil {
				errs <- nil
				return
			}
			_, err := n.stop(nodeStopTimeout)
			errs <- err
		}()
	}
	var all []error
	for range s.c.nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
