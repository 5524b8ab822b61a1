package nemesis

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ordo-relay/ordo/bench/internal/harness"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// fleet is the system under the nemesis: node processes (the real node
// binary), each reaching every source's database and RabbitMQ through TCP
// proxies of its own and gossiping through the gossip net, and an order
// API (the real binary) on each source's database. Slots keep their name, gossip addresses
// and proxies across restarts. It is driven from one goroutine; pid is
// safe for concurrent use (the gossip proxies call it).
type fleet struct {
	r        *harness.Rig
	cl       *harness.Cluster // names, the current process of each slot, /status
	dbs      []*runDB
	pg       [][]*testkit.Proxy // by slot, then by source (dbs' order)
	amqp     []*testkit.Proxy
	binds    []string // the nodes' own gossip addresses
	gossip   *gossipNet
	token    string // the nodes' admin token, for the operator CLI
	exchange string
	pids     []atomic.Int64
	paused   []bool
}

// nodeApp is a node's application_name and connection_name.
func nodeApp(name string) string { return "ordo node " + name }

// newFleet prepares size slots (proxies, gossip net) on the rig for the
// sources dbs; nothing runs yet. Everything is closed with the rig.
func newFleet(r *harness.Rig, size int, exchange string, dbs []*runDB) (*fleet, error) {
	tag := r.Name[strings.LastIndexByte(r.Name, '_')+1:]
	f := &fleet{r: r, exchange: exchange, dbs: dbs, pids: make([]atomic.Int64, size), paused: make([]bool, size),
		token: harness.RandomHex(16)}
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand crashes the program instead)
	f.cl = &harness.Cluster{Rig: r, Gossip: true, GossipKey: base64.StdEncoding.EncodeToString(key),
		Nodes: make([]*harness.Node, size), Client: &http.Client{Timeout: harness.StatusTimeout}}
	pgHost, amqpHost := hostOf(r.DBURL), hostOf(r.Config.AMQPURL)
	if pgHost == "" || amqpHost == "" {
		return nil, errors.New("fleet: the server URLs have no host")
	}
	for i := range size {
		f.cl.Names = append(f.cl.Names, fmt.Sprintf("nem%s-n%d", tag, i+1))
		var pgs []*testkit.Proxy
		for range dbs {
			pg, err := r.StartProxy(pgHost)
			if err != nil {
				return nil, err
			}
			pgs = append(pgs, pg)
		}
		am, err := r.StartProxy(amqpHost)
		if err != nil {
			return nil, err
		}
		bind, err := harness.FreeAddr()
		if err != nil {
			return nil, err
		}
		f.pg, f.amqp, f.binds = append(f.pg, pgs), append(f.amqp, am), append(f.binds, bind)
	}
	g, err := newGossipNet(f.binds, f.pid)
	if err != nil {
		return nil, err
	}
	f.gossip = g
	r.OnClose("close the gossip proxies", func(context.Context) error { f.gossip.close(); return nil })
	return f, nil
}

func hostOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	return u.Host
}

// names returns the slots' node names.
func (f *fleet) names() []string { return f.cl.Names }

// apps returns the application (connection) names of the given slots.
func (f *fleet) apps(slots ...int) []string {
	var out []string
	for _, i := range slots {
		out = append(out, nodeApp(f.cl.Names[i]))
	}
	return out
}

// all returns every slot.
func (f *fleet) all() []int {
	out := make([]int, len(f.cl.Names))
	for i := range out {
		out[i] = i
	}
	return out
}

// pid returns slot i's current process id, 0 when none runs.
func (f *fleet) pid(i int) int { return int(f.pids[i].Load()) }

// start starts slot i's node.
func (f *fleet) start(ctx context.Context, i int) error {
	urls := make([]string, len(f.dbs))
	for s, db := range f.dbs {
		urls[s] = f.pg[i][s].URL(db.url)
	}
	env := []string{
		nodeSourceEnv(f.dbs, urls),
		"ORDO_GOSSIP_ADDR=" + f.binds[i],
		"ORDO_GOSSIP_ADVERTISE=" + f.gossip.addrs()[i],
		"ORDO_JOIN=" + strings.Join(f.gossip.addrs(), ","),
		"ORDO_GOSSIP_KEY=" + f.cl.GossipKey,
		"ORDO_REJOIN_INTERVAL=" + harness.RejoinInterval,
		"ORDO_LEASE_TTL=" + nemesisTTL.String(),
		"ORDO_ADMIN_TOKEN=" + f.token,
		"ORDO_DB_MAX_CONNS=4",
	}
	n, err := f.r.StartNode(ctx, f.cl.Names[i], f.amqp[i].URL(f.r.Config.AMQPURL), env...)
	if err != nil {
		return err
	}
	f.cl.Nodes[i] = n
	f.pids[i].Store(int64(n.Pid()))
	return nil
}

// kill kills slot i's node with SIGKILL.
func (f *fleet) kill(i int) {
	f.pids[i].Store(0)
	f.cl.Nodes[i].Kill()
}

// signal sends sig to slot i's node and keeps track of SIGSTOP/SIGCONT.
func (f *fleet) signal(i int, sig syscall.Signal) error {
	if err := f.cl.Nodes[i].Proc.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, f.cl.Names[i], err)
	}
	f.paused[i] = sig == syscall.SIGSTOP
	return nil
}

// resumeAll sends SIGCONT to every paused node (a stopped node would not
// stop on SIGTERM).
func (f *fleet) resumeAll() {
	for i, p := range f.paused {
		if p {
			_ = f.signal(i, syscall.SIGCONT)
		}
	}
}

// failed returns the first error of a node or the order API that exited
// on its own.
func (f *fleet) failed() error {
	if err := f.cl.Failed(); err != nil {
		return err
	}
	for _, db := range f.dbs {
		if db.api != nil {
			if err := db.api.Failed(); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitConverged waits until every node agrees on the map and holds its
// leases.
func (f *fleet) waitConverged(ctx context.Context) error {
	_, _, err := f.cl.WaitConverged(ctx, f.all(), harness.ConvergeTimeout)
	return err
}

// stopNodes stops every node (SIGTERM) and waits for them.
func (f *fleet) stopNodes() error {
	f.resumeAll()
	return f.cl.Stop()
}

// startAPIs starts an order API on each source's database, the events
// addressed to the fleet's exchange, and waits until they answer.
func (f *fleet) startAPIs(ctx context.Context) ([]loadTarget, error) {
	var out []loadTarget
	for _, db := range f.dbs {
		name := "orderapi"
		if db.name != sourceNames[0] {
			name += "-" + db.name
		}
		api, err := f.r.StartOrderAPI(ctx, name, db.url, f.exchange)
		if err != nil {
			return nil, err
		}
		db.api = api
		out = append(out, loadTarget{source: db.name, addr: api.HTTPAddr})
	}
	return out, nil
}

// admin runs the operator CLI (node SUBCOMMAND -http ADDR ...) against the
// first running node and returns its output.
func (f *fleet) admin(ctx context.Context, sub string, args ...string) (string, error) {
	bin, err := harness.NodeBinary(ctx, f.r.Config)
	if err != nil {
		return "", err
	}
	for i, n := range f.cl.Nodes {
		if n == nil || n.Exited() || f.paused[i] {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cmd := exec.CommandContext(cctx, bin, append([]string{sub, "-http", n.HTTPAddr, "-admin-token", f.token, "-operator", "nemesis"}, args...)...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			return string(out), fmt.Errorf("node %s %s: %w: %s", sub, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return string(out), nil
	}
	return "", errors.New("operator CLI: no node runs")
}
