package harness

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

	"github.com/ordo-relay/ordo/node"
)

const (
	// StatusTimeout bounds one GET /status.
	StatusTimeout = 2 * time.Second
	// ConvergePoll is how often convergence is checked.
	ConvergePoll = 50 * time.Millisecond
	// ConvergeTimeout bounds a wait for convergence.
	ConvergeTimeout = time.Minute
	// RejoinInterval is the nodes' ORDO_REJOIN_INTERVAL.
	RejoinInterval = "1s"
)

// Cluster is a set of node slots n1..nN on the rig's database. Each slot
// has a fixed name and gossip address, so a node killed and started again
// comes back as the same member; every node lists every slot's gossip
// address as a seed, started or not. With gossip off (one node) the node
// runs alone and owns every partition. Gossip is encrypted with a key
// drawn for the run, as a real cluster's would be.
type Cluster struct {
	Rig       *Rig
	AMQPURL   string
	Gossip    bool
	GossipKey string // base64, shared by every slot
	Names     []string
	Addrs     []string // gossip addresses
	Nodes     []*Node  // the current process of each slot; nil before its first start
	Client    *http.Client
	Env       []string                      // extra ORDO_* variables for every node
	OnStart   func(slot int, n *Node) error // called right after a node's process started; may be nil
}

// NewCluster prepares size slots. Nothing is started yet.
func NewCluster(r *Rig, amqpURL string, size int, gossip bool) (*Cluster, error) {
	c := &Cluster{Rig: r, AMQPURL: amqpURL, Gossip: gossip, Nodes: make([]*Node, size),
		Client: &http.Client{Timeout: StatusTimeout}}
	if gossip {
		key := make([]byte, 32)
		rand.Read(key) // never fails (crypto/rand crashes the program instead)
		c.GossipKey = base64.StdEncoding.EncodeToString(key)
	}
	for i := range size {
		c.Names = append(c.Names, fmt.Sprintf("n%d", i+1))
		if gossip {
			a, err := FreeAddr()
			if err != nil {
				return nil, err
			}
			c.Addrs = append(c.Addrs, a)
		}
	}
	return c, nil
}

// Start starts slot i's node (again, if it ran before and has exited).
func (c *Cluster) Start(ctx context.Context, i int) (*Node, error) {
	if n := c.Nodes[i]; n != nil && !n.Exited() {
		return nil, fmt.Errorf("start %s: still running", c.Names[i])
	}
	var env []string
	if c.Gossip {
		env = []string{
			"ORDO_GOSSIP_ADDR=" + c.Addrs[i],
			"ORDO_JOIN=" + strings.Join(c.Addrs, ","),
			"ORDO_GOSSIP_KEY=" + c.GossipKey,
			"ORDO_REJOIN_INTERVAL=" + RejoinInterval,
		}
	}
	n, err := c.Rig.StartNode(ctx, c.Names[i], c.AMQPURL, append(env, c.Env...)...)
	if err != nil {
		return nil, err
	}
	c.Nodes[i] = n
	if c.OnStart != nil {
		if err := c.OnStart(i, n); err != nil {
			n.Kill()
			return nil, fmt.Errorf("start %s: %w", c.Names[i], err)
		}
	}
	return n, nil
}

// Running returns the slots whose node runs.
func (c *Cluster) Running() []int {
	var out []int
	for i, n := range c.Nodes {
		if n != nil && !n.Exited() {
			out = append(out, i)
		}
	}
	return out
}

// Failed returns the first error of a node that exited without being
// stopped or killed.
func (c *Cluster) Failed() error {
	for _, n := range c.Nodes {
		if n == nil {
			continue
		}
		if err := n.Failed(); err != nil {
			return err
		}
	}
	return nil
}

// NodeStatus is a node's /status document (node.Status, the type the node
// encodes it from), with the bench's questions about it as methods.
type NodeStatus struct {
	node.Status
}

// Epochs returns the lease epoch of every partition.
func (s NodeStatus) Epochs() map[int]int64 {
	m := make(map[int]int64, len(s.Leases))
	for _, l := range s.Leases {
		m[l.Partition] = l.Epoch
	}
	return m
}

// Assigned returns the partitions the map gives to name.
func (s NodeStatus) Assigned(name string) []int {
	var out []int
	for p, o := range s.Assignment {
		if o == name {
			out = append(out, p)
		}
	}
	return out
}

// Status fetches slot i's /Status.
func (c *Cluster) Status(ctx context.Context, i int) (NodeStatus, error) {
	var st NodeStatus
	n := c.Nodes[i]
	if n == nil {
		return st, fmt.Errorf("status of %s: not started", c.Names[i])
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTPAddr+"/status", nil)
	if err != nil {
		return st, fmt.Errorf("status of %s: %w", c.Names[i], err)
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return st, fmt.Errorf("status of %s: %w", c.Names[i], err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status of %s: %s", c.Names[i], resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("status of %s: decode: %w", c.Names[i], err)
	}
	return st, nil
}

// Converged checks that the nodes of slots want agree, for every source
// they relay: every one's map is the same, its owners are exactly those
// nodes, and the database's lease owner of every partition is the owner
// the map says. It returns the statuses, and why not when they do not
// agree ("" when they do). A node that does not answer is a reason, not
// an error.
func (c *Cluster) Converged(ctx context.Context, want []int) ([]NodeStatus, string) {
	sts := make([]NodeStatus, 0, len(want))
	names := map[string]bool{}
	for _, i := range want {
		names[c.Names[i]] = true
	}
	for _, i := range want {
		st, err := c.Status(ctx, i)
		if err != nil {
			return nil, err.Error()
		}
		vs := st.views()
		if len(sts) > 0 && len(vs) != len(sts[0].views()) {
			return nil, fmt.Sprintf("%s relays %d sources, %s %d", c.Names[i], len(vs), sts[0].Node, len(sts[0].views()))
		}
		for k, v := range vs {
			if len(sts) > 0 && !slices.Equal(sts[0].views()[k].Assignment, v.Assignment) {
				return nil, fmt.Sprintf("%s's map of %s differs from %s's", c.Names[i], v.Name, sts[0].Node)
			}
			if why := agrees(v, c.Names[i], names); why != "" {
				return nil, why
			}
		}
		sts = append(sts, st)
	}
	return sts, ""
}

// views returns each source's part of the status: Sources, or the
// top-level fields for a node that lists none.
func (s NodeStatus) views() []node.SourceStatus {
	if len(s.Sources) > 0 {
		return s.Sources
	}
	return []node.SourceStatus{{Name: "default", Assignment: s.Assignment, Leases: s.Leases}}
}

// agrees checks source v's map on the node named self: its owners are
// exactly names, and every lease is held by the owner the map says.
func agrees(v node.SourceStatus, self string, names map[string]bool) string {
	owners := map[string]bool{}
	for _, o := range v.Assignment {
		owners[o] = true
	}
	if len(owners) != len(names) {
		return fmt.Sprintf("%s's map of %s has %d owners, want %d", self, v.Name, len(owners), len(names))
	}
	for o := range owners {
		if !names[o] {
			return fmt.Sprintf("%s's map of %s names %s", self, v.Name, o)
		}
	}
	for _, l := range v.Leases {
		if l.Partition >= len(v.Assignment) || l.Owner != v.Assignment[l.Partition] {
			return fmt.Sprintf("%s partition %d: lease held by %q", v.Name, l.Partition, l.Owner)
		}
	}
	return ""
}

// WaitConverged polls converged until it holds and returns the statuses
// and when agreement was first seen. A node exiting is an error.
func (c *Cluster) WaitConverged(ctx context.Context, want []int, timeout time.Duration) ([]NodeStatus, time.Time, error) {
	var sts []NodeStatus
	var at time.Time
	var why string
	err := WaitUntil(ctx, timeout, ConvergePoll, fmt.Sprintf("%d nodes to converge", len(want)), func() (bool, error) {
		if err := c.Failed(); err != nil {
			return false, err
		}
		sts, why = c.Converged(ctx, want)
		at = time.Now()
		return why == "", nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%w (last: %s)", err, why)
	}
	return sts, at, nil
}

// ClaimTimes returns, for each partition p in epochs, when the first
// lease claim of p at an epoch above epochs[p] was recorded in
// ordo_lease_audit (the database's clock, which is the bench's: same
// machine). Partitions without such a claim yet are missing from the map.
func (c *Cluster) ClaimTimes(ctx context.Context, epochs map[int]int64) (map[int]time.Time, error) {
	ps := make([]int32, 0, len(epochs))
	es := make([]int64, 0, len(epochs))
	for p, e := range epochs {
		ps = append(ps, int32(p))
		es = append(es, e)
	}
	rows, err := c.Rig.Pool.Query(ctx, sqlClaimTimes, ps, es)
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

// Stop stops every node (SIGTERM, in parallel) and waits for them.
func (c *Cluster) Stop() error {
	errs := make(chan error, len(c.Nodes))
	for _, n := range c.Nodes {
		go func() {
			if n == nil {
				errs <- nil
				return
			}
			_, err := n.Stop(NodeStopTimeout)
			errs <- err
		}()
	}
	var all []error
	for range c.Nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
