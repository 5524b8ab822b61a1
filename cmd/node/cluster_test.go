package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/node"
	"github.com/ordo-relay/ordo/outbox"
)

// cluster is n node processes sharing one database and gossiping.
type cluster struct {
	f      *fixture
	names  []string
	gossip []string
	http   []string
	procs  []*testkit.Process
	extra  []string
	// pgURL and amqpURL, when set, are each node's own URLs (through
	// proxies of its own); otherwise every node uses the fixture's.
	pgURL, amqpURL []string
	// sourcesEnv, when set, is each node's ORDO_SOURCES=... in place of
	// ORDO_POSTGRES_URL.
	sourcesEnv []string
}

func newCluster(t *testing.T, f *fixture, n int, extra ...string) *cluster {
	return startCluster(t, &cluster{f: f, extra: extra}, n)
}

func startCluster(t *testing.T, c *cluster, n int) *cluster {
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("n%d", i+1))
		c.gossip = append(c.gossip, testkit.FreeAddr(t))
		c.http = append(c.http, testkit.FreeAddr(t))
	}
	c.procs = make([]*testkit.Process, n)
	for i := range n {
		c.start(t, i)
	}
	return c
}

func (c *cluster) start(t *testing.T, i int) {
	t.Helper()
	pgURL, amqpURL := c.f.dbURL, testkit.AMQPURL()
	if c.pgURL != nil {
		pgURL, amqpURL = c.pgURL[i], c.amqpURL[i]
	}
	db := "ORDO_POSTGRES_URL=" + pgURL
	if c.sourcesEnv != nil {
		db = c.sourcesEnv[i]
	}
	env := append([]string{
		db,
		"ORDO_AMQP_URL=" + amqpURL,
		"ORDO_NODE_NAME=" + c.names[i],
		"ORDO_HTTP_ADDR=" + c.http[i],
		"ORDO_GOSSIP_ADDR=" + c.gossip[i],
		"ORDO_JOIN=" + strings.Join(c.gossip, ","),
		"ORDO_GOSSIP_KEY=" + testGossipKey,
		"ORDO_REJOIN_INTERVAL=1s",
		"ORDO_POLL_INTERVAL=200ms",
		"ORDO_DB_MAX_CONNS=3",
	}, c.extra...)
	for attempt := 1; ; attempt++ {
		c.procs[i] = testkit.StartProcess(t, c.names[i], c.f.bin, nil, env)
		err := c.procs[i].AwaitOutput("node started", 30*time.Second)
		if err == nil {
			return
		}
		// Another test may have taken a port FreeAddr handed out: take new
		// ones and start again.
		if attempt == 3 || !strings.Contains(c.procs[i].Output(), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("%s: a port was taken meanwhile; retrying with new ones", c.names[i])
		c.gossip[i], c.http[i] = testkit.FreeAddr(t), testkit.FreeAddr(t)
		env = retarget(env, c.http[i], c.gossip[i])
	}
}

// retarget replaces the HTTP and gossip addresses in a node's environment.
func retarget(env []string, httpAddr, gossipAddr string) []string {
	out := make([]string, 0, len(env))
	for _, e := range env {
		switch {
		case strings.HasPrefix(e, "ORDO_HTTP_ADDR="):
			e = "ORDO_HTTP_ADDR=" + httpAddr
		case strings.HasPrefix(e, "ORDO_GOSSIP_ADDR=") && gossipAddr != "":
			e = "ORDO_GOSSIP_ADDR=" + gossipAddr
		}
		out = append(out, e)
	}
	return out
}

func (c *cluster) status(t *testing.T, i int) (node.Status, bool) {
	t.Helper()
	var st node.Status
	resp, err := httpClient.Get("http://" + c.http[i] + "/status")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(&st) == nil
}

// waitConverged waits until the running nodes agree on the map, it is
// balanced over them, and the database's lease holders match it.
func (c *cluster) waitConverged(t *testing.T, running []int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var why string
	for time.Since(start) < timeout {
		why = c.converged(t, running)
		if why == "" {
			d := time.Since(start)
			t.Logf("cluster %v converged after %v", running, d.Round(time.Millisecond))
			return d
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("cluster %v did not converge within %v: %s", running, timeout, why)
	return 0
}

func (c *cluster) converged(t *testing.T, running []int) string {
	var first []string
	for _, i := range running {
		st, ok := c.status(t, i)
		if !ok {
			return fmt.Sprintf("%s: no status", c.names[i])
		}
		if first == nil {
			first = st.Assignment
		} else if !slices.Equal(first, st.Assignment) {
			return fmt.Sprintf("%s's map differs", c.names[i])
		}
		counts := map[string]int{}
		for _, o := range st.Assignment {
			counts[o]++
		}
		limit := (len(st.Assignment) + len(running) - 1) / len(running)
		if len(counts) != len(running) {
			return fmt.Sprintf("%s's map has %d owners, want %d", c.names[i], len(counts), len(running))
		}
		for o, n := range counts {
			if n > limit {
				return fmt.Sprintf("%s owns %d > %d", o, n, limit)
			}
		}
		for _, l := range st.Leases {
			if l.Owner != st.Assignment[l.Partition] {
				return fmt.Sprintf("partition %d leased to %q, assigned to %q", l.Partition, l.Owner, st.Assignment[l.Partition])
			}
		}
	}
	return ""
}

// load commits OrderPlaced + OrderCancelled pairs until stopped.
type load struct {
	stop context.CancelFunc
	wg   sync.WaitGroup
	n    int
}

func (f *fixture) startLoad(t *testing.T) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{stop: cancel}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for ctx.Err() == nil {
			key := uuid.NewString()
			for _, typ := range []string{"placed", "cancelled"} {
				var ids []uuid.UUID
				err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
					var err error
					ids, err = f.prod.Enqueue(ctx, tx, outbox.Message{CorrelationID: key, Exchange: f.exchange,
						RoutingKey: "order." + typ, Type: "order-" + typ, Payload: json.RawMessage(`{}`)})
					return err
				})
				if err != nil {
					return // stopped: that transaction did not commit
				}
				f.checker.Expect(ids[0].String()) // only once committed
				l.n++
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(l.halt)
	return l
}

func (l *load) halt() { l.stop(); l.wg.Wait() }

func TestClusterMapAgreement(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := newCluster(t, f, 3)
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
}

// TestClusterKillNode: kill -9 a node under load; its partitions are taken
// over, nothing is lost and per-key order holds.
func TestClusterKillNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := newCluster(t, f, 3)
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
	st, _ := c.status(t, 2)
	l := f.startLoad(t)
	f.checker.WaitDistinct(t, 200, 30*time.Second)

	killed := time.Now()
	c.procs[2].Kill()
	c.waitConverged(t, []int{0, 1}, 30*time.Second)
	ctx := testkit.Context(t, 10*time.Second)
	var last time.Time
	if err := f.pool.QueryRow(ctx, `SELECT max(at) FROM ordo_lease_audit WHERE event = 'claim' AND node <> 'n3' AND partition = ANY($1)`,
		st.Held).Scan(&last); err != nil {
		t.Fatal(err)
	}
	t.Logf("takeover: every partition of the killed node claimed %v after kill -9", last.Sub(killed).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // keep the load running across the takeover
	l.halt()
	rep := f.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("after kill -9 with %d messages: %s", l.n, rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

// TestClusterRollingRestart: restart every node in turn under load.
func TestClusterRollingRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := newCluster(t, f, 3)
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
	l := f.startLoad(t)
	for i := range 3 {
		if err := c.procs[i].Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := c.procs[i].Wait(20 * time.Second); err != nil || code != 0 {
			t.Fatalf("%s exited %d (%v)", c.names[i], code, err)
		}
		c.start(t, i)
		c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
	}
	l.halt()
	rep := f.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("rolling restart with %d messages: %s", l.n, rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
}

// TestClusterPausedNode: SIGSTOP a node past its lease, then SIGCONT. The
// audit records exactly one lost renewal per lease it held, and refuses its
// writes at those epochs (as many as it counts refused itself); after the
// takeover at most W of its messages carry the old epoch; nothing is lost,
// reordered or skipped.
func TestClusterPausedNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const window = 16
	c := newCluster(t, f, 3, fmt.Sprintf("ORDO_CONFIRM_WINDOW=%d", window))
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
	st, _ := c.status(t, 2)
	oldEpoch := map[int]int64{}
	for _, l := range st.Leases {
		if l.Owner == "n3" {
			oldEpoch[l.Partition] = l.Epoch
		}
	}
	l := f.startLoad(t)
	f.checker.WaitDistinct(t, 200, 30*time.Second)

	stoppedAt := time.Now()
	if err := c.procs[2].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(t, []int{0, 1}, 30*time.Second)
	ctx := testkit.Context(t, 30*time.Second)
	var claimedAt time.Time
	if err := f.pool.QueryRow(ctx, `SELECT min(at) FROM ordo_lease_audit WHERE event = 'claim' AND node <> 'n3'
		AND partition = ANY($1) AND at > $2`, keys(oldEpoch), stoppedAt).Scan(&claimedAt); err != nil {
		t.Fatal(err)
	}
	t.Logf("the paused node's partitions were first claimed %v after SIGSTOP", claimedAt.Sub(stoppedAt).Round(time.Millisecond))
	if err := c.procs[2].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(t, []int{0, 1, 2}, 30*time.Second)
	l.halt()
	rep := f.checker.WaitFor(t, 30*time.Second, func(r testkit.Report) bool { return r.Lost == 0 })
	t.Logf("paused node, %d messages: %s", l.n, rep)
	if !rep.OK() {
		t.Fatalf("checker: %s", rep.Detail())
	}
	stale := 0
	for _, d := range f.checker.Deliveries() {
		if e, ok := oldEpoch[d.Partition]; ok && d.Epoch == e && d.Received.After(claimedAt) {
			stale++
		}
	}
	t.Logf("%d messages with the paused node's old epoch arrived after the takeover (W = %d)", stale, window)
	if stale > window {
		t.Fatalf("%d stale-epoch messages after the takeover, more than W = %d", stale, window)
	}
	c.checkPausedAudit(t, "n3", oldEpoch)
}

// checkPausedAudit checks what the audit says of a node paused past its
// leases and resumed: exactly one lost renewal for each lease it held, at
// the epoch it held, and every write refused at one of those epochs, as
// many rows as the node itself counts refused.
func (c *cluster) checkPausedAudit(t *testing.T, name string, held map[int]int64) {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	rows, err := c.f.pool.Query(ctx, `SELECT partition, epoch, event, coalesce(detail, '') FROM ordo_lease_audit
		WHERE node = $1 AND event IN ('renew-failed', 'refused-write') ORDER BY id`, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	lost := map[int]int64{}
	refusedRows := map[string]int{}
	detail := regexp.MustCompile(`^(.*) of (\d+) row\(s\) with a stale epoch$`)
	for rows.Next() {
		var p int
		var epoch int64
		var event, d string
		if err := rows.Scan(&p, &epoch, &event, &d); err != nil {
			t.Fatal(err)
		}
		if want, ok := held[p]; !ok || epoch != want {
			t.Fatalf("%s on partition %d at epoch %d; %s held %v before the pause", event, p, epoch, name, held)
		}
		if event == "renew-failed" {
			if _, dup := lost[p]; dup {
				t.Fatalf("the lost renewal of partition %d audited twice", p)
			}
			lost[p] = epoch
			continue
		}
		m := detail.FindStringSubmatch(d)
		if m == nil {
			t.Fatalf("refused write with detail %q", d)
		}
		n, _ := strconv.Atoi(m[2])
		refusedRows[m[1]] += n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lost) != len(held) {
		t.Fatalf("%d lost renewals audited, want one for each of the %d leases %s held", len(lost), len(held), name)
	}
	st, ok := c.status(t, slices.Index(c.names, name))
	if !ok {
		t.Fatalf("no status from %s", name)
	}
	t.Logf("audit: %d lost renewals; refused writes %v; %s counts %d marks refused", len(lost), refusedRows, name, st.Relay.Refused)
	if int64(refusedRows["mark"]) != st.Relay.Refused || len(refusedRows) > 1 {
		t.Fatalf("the audit refused %v of %s's writes at its old epochs; it counts %d marks refused", refusedRows, name, st.Relay.Refused)
	}
}

func keys(m map[int]int64) []int32 {
	out := make([]int32, 0, len(m))
	for k := range m {
		out = append(out, int32(k))
	}
	return out
}

var httpClient = &http.Client{Timeout: 5 * time.Second}
