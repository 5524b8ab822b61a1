package nemesis

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/childproc"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// The shipping instances' settings in the consumer scenario.
const (
	shippingInstances = 3
	shippingShards    = 6
	shippingConns     = 6 // PostgreSQL connections per instance
	shippingLeaseTTL  = nemesisTTL
	// shippingMaxAttempts is high enough that the injected failures
	// (errorRate + panicRate per attempt) never dead-letter a good
	// message: 0.05^8 is 4e-11.
	shippingMaxAttempts = 8
	shippingErrorRate   = 0.03
	shippingPanicRate   = 0.02
	// poisonPrefix starts the ids of the orders whose handler always fails.
	poisonPrefix = "nemesis-poison-"
)

// shippingFleet is the consumer side under the nemesis: cmd/shipping
// processes of one consumer group on a shipping database of their own,
// each reaching PostgreSQL through a TCP proxy of its own, with the
// handler's fault injection on. Slots keep their instance name and proxy
// across restarts. It is driven from one goroutine.
type shippingFleet struct {
	r        *harness.Rig
	cfg      harness.Config // NodeBin is the shipping binary
	dbURL    string         // the shipping database
	group    string         // the consumer group (inbox Config.Name)
	exchange string
	names    []string
	pg       []*testkit.Proxy
	procs    []*harness.Node
	paused   []bool
}

// shippingBuildTag builds cmd/shipping with its fault injection
// (internal/inboxfaults: the ORDO_FAULT_* variables below), which the
// default build leaves out.
const shippingBuildTag = "ordofaults"

// newShippingFleet builds cmd/shipping (with shippingBuildTag) and
// prepares size slots on the shipping database dbURL; nothing runs yet.
func newShippingFleet(ctx context.Context, r *harness.Rig, dbURL, group, exchange string, size int) (*shippingFleet, error) {
	bin, _, err := childproc.Build(ctx, "github.com/ordo-relay/ordo/cmd/shipping", "-tags", shippingBuildTag)
	if err != nil {
		return nil, err
	}
	s := &shippingFleet{r: r, cfg: r.Config, dbURL: dbURL, group: group, exchange: exchange,
		procs: make([]*harness.Node, size), paused: make([]bool, size)}
	s.cfg.NodeBin = bin
	pgHost := hostOf(dbURL)
	for i := range size {
		s.names = append(s.names, fmt.Sprintf("s%d", i+1))
		p, err := r.StartProxy(pgHost)
		if err != nil {
			return nil, err
		}
		s.pg = append(s.pg, p)
	}
	return s, nil
}

// app is slot i's broker connection name (the inbox's).
func (s *shippingFleet) app(i int) string { return "ordo inbox " + s.group + " " + s.names[i] }

// apps returns the broker connection names of slots.
func (s *shippingFleet) apps(slots ...int) []string {
	var out []string
	for _, i := range slots {
		out = append(out, s.app(i))
	}
	return out
}

// all returns every slot.
func (s *shippingFleet) all() []int {
	out := make([]int, len(s.names))
	for i := range out {
		out[i] = i
	}
	return out
}

// running returns the slots whose process runs.
func (s *shippingFleet) running() []int {
	var out []int
	for i, p := range s.procs {
		if p != nil && !p.Exited() {
			out = append(out, i)
		}
	}
	return out
}

// start starts slot i's instance.
func (s *shippingFleet) start(ctx context.Context, i int) error {
	env := []string{
		"ORDO_NAME=" + s.group,
		"ORDO_INSTANCE=" + s.names[i],
		"ORDO_EXCHANGE=" + s.exchange,
		"ORDO_SHARDS=" + strconv.Itoa(shippingShards),
		"ORDO_DB_MAX_CONNS=" + strconv.Itoa(shippingConns),
		"ORDO_LEASE_TTL=" + shippingLeaseTTL.String(),
		"ORDO_HEARTBEAT=2s",
		"ORDO_MAX_ATTEMPTS=" + strconv.Itoa(shippingMaxAttempts),
		"ORDO_RETRY_MIN=20ms",
		"ORDO_RETRY_MAX=500ms",
		"ORDO_STATS_EVERY=0",
		"ORDO_LOG_LEVEL=warn",
		"ORDO_FAULT_ERROR_RATE=" + strconv.FormatFloat(shippingErrorRate, 'f', -1, 64),
		"ORDO_FAULT_PANIC_RATE=" + strconv.FormatFloat(shippingPanicRate, 'f', -1, 64),
		"ORDO_FAULT_POISON_PREFIX=" + poisonPrefix,
	}
	p, err := harness.StartProcess(ctx, s.cfg, s.names[i], s.pg[i].URL(s.dbURL), s.cfg.AMQPURL, env...)
	if err != nil {
		return err
	}
	s.procs[i] = p
	s.r.OnClose("stop shipping "+s.names[i], func(context.Context) error {
		if s.paused[i] {
			_ = p.Proc.Signal(syscall.SIGCONT)
		}
		_, err := p.Stop(harness.NodeStopTimeout)
		return err
	})
	return nil
}

// kill kills slot i's instance with SIGKILL.
func (s *shippingFleet) kill(i int) { s.procs[i].Kill() }

// leave stops slot i's instance gracefully (SIGTERM): it hands its shards
// back and leaves the group.
func (s *shippingFleet) leave(i int) error {
	_, err := s.procs[i].Stop(harness.NodeStopTimeout)
	return err
}

// signal sends sig to slot i's instance and keeps track of SIGSTOP/SIGCONT.
func (s *shippingFleet) signal(i int, sig syscall.Signal) error {
	if err := s.procs[i].Proc.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, s.names[i], err)
	}
	s.paused[i] = sig == syscall.SIGSTOP
	return nil
}

// resumeAll continues every paused instance.
func (s *shippingFleet) resumeAll() {
	for i, p := range s.paused {
		if p {
			_ = s.signal(i, syscall.SIGCONT)
		}
	}
}

// failed returns the first error of an instance that exited on its own.
func (s *shippingFleet) failed() error {
	for _, p := range s.procs {
		if p == nil {
			continue
		}
		if err := p.Failed(); err != nil {
			return err
		}
	}
	return nil
}

// stopAll stops every running instance (SIGTERM) and waits for them.
func (s *shippingFleet) stopAll() error {
	s.resumeAll()
	var first error
	for _, i := range s.running() {
		if _, err := s.procs[i].Stop(harness.NodeStopTimeout); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// sqlShardOwners lists the group's shard leases: owner, and whether live.
const sqlShardOwners = `
SELECT coalesce(owner, ''), expires_at > now() FROM ordo_inbox_leases WHERE consumer = $1`

// balanced reports whether the running instances hold every shard's
// lease, unexpired, each its share (floor or ceil of shards/instances).
func (s *shippingFleet) balanced(ctx context.Context, q *pgxpool.Pool) (bool, error) {
	rows, err := q.Query(ctx, sqlShardOwners, s.group)
	if err != nil {
		return false, nil // the database restarting: not yet
	}
	defer rows.Close()
	count := map[string]int{}
	total := 0
	for rows.Next() {
		var owner string
		var live bool
		if err := rows.Scan(&owner, &live); err != nil {
			return false, nil
		}
		if live && owner != "" {
			count[owner]++
		}
		total++
	}
	if rows.Err() != nil || total != shippingShards {
		return false, nil
	}
	run := s.running()
	if len(run) == 0 {
		return false, fmt.Errorf("no shipping instance runs")
	}
	sum := 0
	for _, i := range run {
		k := count[s.names[i]]
		if k < shippingShards/len(run) || k > (shippingShards+len(run)-1)/len(run) {
			return false, nil
		}
		sum += k
	}
	return sum == shippingShards, nil
}

// waitBalanced waits until balanced holds.
func (s *shippingFleet) waitBalanced(ctx context.Context, q *pgxpool.Pool) error {
	return harness.WaitUntil(ctx, harness.ConvergeTimeout, 100*time.Millisecond, "the shards to be balanced over the shipping instances", func() (bool, error) {
		if err := s.failed(); err != nil {
			return false, err
		}
		return s.balanced(ctx, q)
	})
}
