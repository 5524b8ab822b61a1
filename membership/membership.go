// Package membership runs gossip membership for an Ordo cluster with
// hashicorp/memberlist and hands the live member set to partition code as
// copied values.
//
// Gossip decides who should own a partition (see partition.Assign); the
// PostgreSQL lease decides who does. Views may disagree for seconds during
// joins, failures and network splits: that is safe because every relay
// write is fenced by the lease epoch.
package membership

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// ParseKeys decodes a comma-separated list of base64 gossip keys.
func ParseKeys(s string) ([][]byte, error) {
	if s == "" {
		return nil, nil
	}
	var keys [][]byte
	for _, part := range bytes.Split([]byte(s), []byte(",")) {
		k, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(part)))
		if err != nil {
			return nil, fmt.Errorf("gossip key: not base64: %w", err)
		}
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return nil, fmt.Errorf("gossip key: %d bytes; want 16, 24 or 32", n)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Member is one node as this node sees it.
type Member struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"`
	State string `json:"state"` // alive, or gone (left or declared dead)
	// Health is what the member gossips of its dependencies; Eligible,
	// whether partitions are assigned to it now (see Membership.Eligible).
	Health   Health `json:"health"`
	Eligible bool   `json:"eligible"`
}

// Membership is a running gossip member. Create with New, then Run.
type Membership struct {
	cfg     Config
	ml      *memberlist.Memberlist
	keyring *memberlist.Keyring // nil without encryption; safe for concurrent use
	changed chan struct{}

	joined  atomic.Bool   // the first join is over (succeeded, or no seeds)
	meta    atomic.Value  // []byte: this node's metadata, for NodeMeta
	metaSig chan struct{} // this node's health changed: re-advertise it

	mu       sync.Mutex
	events   []event // copied in callbacks, applied by Run
	view     map[string]Member
	alive    []string
	health   Health // this node's own
	elig     eligibility
	eligible []string
	// Per source (Config.Sources): its own eligibility, over the members
	// that relay it.
	eligBy     map[string]*eligibility
	eligibleBy map[string][]string
	recheck    time.Time // when eligibility may change with no new event
	evSig      chan struct{}
	// vetted holds this node's sources whose database identity has been
	// checked against the cluster's (vet); conflicts, the live peers
	// that disagree with this node on a source's database (apply).
	vetted    map[string]bool
	conflicts []Conflict
}

// ErrJoin is returned (wrapped) when none of the seeds could be joined.
var ErrJoin = errors.New("cannot join the cluster")

// New creates the memberlist and starts gossiping on BindAddr, but joins
// no one until Run. Zero fields of cfg take their DefaultConfig value; New
// refuses a cfg that Validate then refuses.
func New(cfg Config) (*Membership, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, port, err := splitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("membership: gossip bind address %q: %w", cfg.BindAddr, err)
	}
	m := &Membership{cfg: cfg, changed: make(chan struct{}, 1), view: map[string]Member{}, evSig: make(chan struct{}, 1),
		metaSig: make(chan struct{}, 1), health: Healthy, elig: eligibility{hold: cfg.HealthHold},
		eligBy: map[string]*eligibility{}, eligibleBy: map[string][]string{}, vetted: map[string]bool{}}
	for _, s := range cfg.sources() {
		m.eligBy[s] = &eligibility{hold: cfg.HealthHold}
	}
	m.meta.Store(encodeMeta(Healthy))

	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeName
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertisePort = port
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		// A specific address is advertised as is; for 0.0.0.0 memberlist
		// picks this host's private address.
		mc.AdvertiseAddr = host
	}
	if cfg.AdvertiseAddr != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = splitHostPort(cfg.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("membership: advertise address %q: %w", cfg.AdvertiseAddr, err)
		}
	}
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeInterval / 2
	mc.GossipInterval = min(mc.GossipInterval, cfg.ProbeInterval/2)
	mc.SuspicionMult = cfg.SuspicionMult
	mc.PushPullInterval = 5 * time.Second
	// No LZW on gossip: the messages are a few hundred bytes on a LAN,
	// and compressing each one cost about 8 % of a node's CPU in a
	// four-node cluster (docs/performance.md). A member decodes a
	// compressed message whatever this says, so members that still
	// compress gossip with those that do not.
	mc.EnableCompression = false
	mc.TCPTimeout = 2 * time.Second
	if len(cfg.Keys) > 0 {
		kr, err := memberlist.NewKeyring(cfg.Keys, cfg.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("membership: gossip keys: %w", err)
		}
		mc.Keyring = kr
		m.keyring = kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Events = (*delegate)(m)
	mc.Delegate = (*delegate)(m)
	mc.Logger = newLogBridge(cfg.Logger)
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start gossip on %s: %w", cfg.BindAddr, err)
	}
	m.ml = ml
	return m, nil
}

// event is a membership callback's node, copied.
type event struct {
	name, addr string
	state      memberlist.NodeStateType
	meta       []byte
}

// delegate receives memberlist's callbacks. They run with memberlist's
// locks held, so they only copy the node and queue it; they never call
// back into memberlist.
type delegate Membership

func (d *delegate) push(n *memberlist.Node, state memberlist.NodeStateType) {
	m := (*Membership)(d)
	m.mu.Lock()
	m.events = append(m.events, event{name: n.Name, addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))),
		state: state, meta: slices.Clone(n.Meta)})
	m.mu.Unlock()
	select {
	case m.evSig <- struct{}{}:
	default:
	}
}

// memberlist does not keep Node.State current, so the callback says it.
func (d *delegate) NotifyJoin(n *memberlist.Node)   { d.push(n, memberlist.StateAlive) }
func (d *delegate) NotifyLeave(n *memberlist.Node)  { d.push(n, memberlist.StateDead) }
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.push(n, memberlist.StateAlive) }

// NodeMeta implements memberlist.Delegate: this node's health. It only
// reads an atomic value.
func (d *delegate) NodeMeta(limit int) []byte {
	b := d.meta.Load().([]byte)
	if len(b) > limit {
		return nil // cannot happen: a few dozen bytes; peers read nothing as healthy
	}
	return b
}

// NotifyMsg, GetBroadcasts, LocalState and MergeRemoteState implement
// memberlist.Delegate; membership sends no messages or state of its own.
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// SetHealth sets what this node gossips of its own dependencies. Run
// advertises it to the cluster (memberlist's UpdateNode) outside
// memberlist's callbacks. Safe for concurrent use.
func (m *Membership) SetHealth(h Health) {
	m.mu.Lock()
	same := m.health == h
	m.health = h
	adv := m.advertised(h)
	m.mu.Unlock()
	if same {
		return
	}
	m.meta.Store(encodeMeta(adv))
	m.cfg.Logger.Info("this node's health changed; advertising it", "broker", h.Broker, "database", h.Database, "sources", h.Sources)
	select {
	case m.metaSig <- struct{}{}:
	default:
	}
	select {
	case m.evSig <- struct{}{}:
	default:
	}
}

// Eligible returns the names of the live members that partitions are
// assigned to, sorted: every live member except those that have been less
// healthy than the healthiest for HealthHold or longer. When a dependency
// is down for every node, nobody is less healthy, and nobody steps aside.
func (m *Membership) Eligible() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.eligible)
}

// EligibleFor returns the names of the live members that the partitions
// of source are assigned to, sorted: those that relay source (see
// Health.For), except those less healthy for source (the broker, and
// source's database) than the healthiest for HealthHold or longer. A node
// cut off from one source's database steps aside for that source only.
// For a source not in Config.Sources it returns nil. With the one source
// wire.DefaultSource, and members that gossip no sources, it is Eligible.
func (m *Membership) EligibleFor(source string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.eligibleBy[source])
}

// Alive returns the names of the live members (alive or suspect),
// sorted, this node included.
func (m *Membership) Alive() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.alive)
}

// Joined reports whether the first join is over. Until then Alive holds
// only this node, which must not be taken for the cluster: a starting node
// that wanted every partition would claim them all, then hand them back.
func (m *Membership) Joined() bool { return m.joined.Load() }

// Members returns every member this node knows of, with its state.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.view))
	for _, x := range m.view {
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b Member) int { return cmpString(a.Name, b.Name) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Changed is signalled (coalesced) whenever Alive or Eligible changes.
func (m *Membership) Changed() <-chan struct{} { return m.changed }

// Run joins the seeds, applies membership events until ctx ends, rejoins
// the seeds every RejoinInterval, and on ctx's end leaves the cluster
// gracefully and shuts gossip down. It returns an error only if the first
// join found seeds but could reach none of them within a minute.
func (m *Membership) Run(ctx context.Context) error {
	advCtx, stopAdv := context.WithCancel(context.Background())
	advDone := make(chan struct{})
	go func() {
		defer close(advDone)
		m.advertise(advCtx)
	}()
	defer func() {
		stopAdv()
		<-advDone
		if err := m.ml.Leave(2 * time.Second); err != nil {
			m.cfg.Logger.Warn("leave the cluster", "err", err)
		}
		if err := m.ml.Shutdown(); err != nil {
			m.cfg.Logger.Warn("shut gossip down", "err", err)
		}
	}()
	m.apply()
	if err := m.firstJoin(ctx); err != nil {
		return err
	}
	m.apply()
	// The sources' identities are checked against those the cluster
	// gossips before this node counts itself joined (and its leasers
	// want partitions): a conflict stops it here.
	if _, err := m.vet(); err != nil {
		return err
	}
	m.readvertise() // the identities checked, before the leasers want partitions
	m.joined.Store(true)
	m.apply()
	select { // the member set may be what it was, but it is now known
	case m.changed <- struct{}{}:
	default:
	}
	rejoin := time.NewTicker(m.cfg.RejoinInterval)
	defer rejoin.Stop()
	recheck := time.NewTimer(time.Hour)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.evSig:
		case <-recheck.C:
		case <-rejoin.C:
			m.join()
		}
		at := m.apply()
		// A source migrated since (its database answered late) is
		// checked now, and stops the node on a conflict.
		if vetted, err := m.vet(); err != nil {
			return err
		} else if vetted {
			m.readvertise()
			at = m.apply()
		}
		if !at.IsZero() {
			recheck.Reset(max(time.Until(at), time.Millisecond))
		}
	}
}

// advertise re-advertises this node, with its new health, whenever
// SetHealth changes it, until ctx ends.
func (m *Membership) advertise(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.metaSig:
		}
		// Waits until the update is broadcast, or a second when no peer
		// can be reached.
		if err := m.ml.UpdateNode(time.Second); err != nil {
			m.cfg.Logger.Debug("advertise health", "err", err)
		}
	}
}

func (m *Membership) firstJoin(ctx context.Context) error {
	if len(m.cfg.Join) == 0 {
		return nil
	}
	deadline := time.Now().Add(m.cfg.JoinTimeout)
	for {
		n, err := m.ml.Join(m.cfg.Join)
		if n > 0 {
			m.cfg.Logger.Info("joined the cluster", "seeds_reached", n)
			return nil
		}
		if time.Now().After(deadline) {
			hint := ""
			if len(m.cfg.Keys) == 0 {
				hint = " (if the cluster uses gossip encryption, this node needs its key: set ORDO_GOSSIP_KEY)"
			} else {
				hint = " (check that every node has the same gossip key)"
			}
			return fmt.Errorf("%w via %v: %v%s", ErrJoin, m.cfg.Join, err, hint)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
		m.apply()
		if len(m.Alive()) > 1 {
			return nil // someone else joined us meanwhile
		}
	}
}

func (m *Membership) join() {
	if len(m.cfg.Join) == 0 {
		return
	}
	if _, err := m.ml.Join(m.cfg.Join); err != nil {
		m.cfg.Logger.Debug("rejoin seeds", "err", err)
	}
}

// apply folds queued events into the view, recomputes the live and
// eligible members, signals Changed if either changed, and returns when
// eligibility may change next without an event (zero: not by itself).
func (m *Membership) apply() time.Time {
	m.mu.Lock()
	evs := m.events
	m.events = nil
	if len(m.view) == 0 {
		// This node itself; memberlist reports it through NotifyJoin too,
		// but the view must never be empty.
		m.view[m.cfg.NodeName] = Member{Name: m.cfg.NodeName, Addr: m.cfg.BindAddr, State: "alive"}
	}
	for _, e := range evs {
		m.view[e.name] = Member{Name: e.name, Addr: e.addr, State: stateName(e.state), Health: decodeMeta(e.meta)}
	}
	self := m.view[m.cfg.NodeName]
	self.Health = m.advertised(m.health) // the newest, whether memberlist reported it yet or not
	m.view[m.cfg.NodeName] = self
	alive := make([]string, 0, len(m.view))
	health := make(map[string]Health, len(m.view))
	for _, x := range m.view {
		if x.State == "alive" || x.State == "suspect" {
			alive = append(alive, x.Name)
			health[x.Name] = x.Health
		}
	}
	conflicts := findConflicts(self.Health, peersOf(health, m.cfg.NodeName))
	appeared, resolved := diffConflicts(m.conflicts, conflicts)
	m.conflicts = conflicts
	slices.Sort(alive)
	now := time.Now()
	eligible, recheck := m.elig.update(now, health)
	for name, x := range m.view {
		x.Eligible = slices.Contains(eligible, name)
		m.view[name] = x
	}
	changed := !slices.Equal(alive, m.alive) || !slices.Equal(eligible, m.eligible)
	for src, e := range m.eligBy {
		el, at := e.update(now, withoutConflicting(healthFor(health, src), src, conflicts))
		if !at.IsZero() && (recheck.IsZero() || at.Before(recheck)) {
			recheck = at
		}
		changed = changed || !slices.Equal(el, m.eligibleBy[src])
		m.eligibleBy[src] = el
	}
	m.alive, m.eligible, m.recheck = alive, eligible, recheck
	m.mu.Unlock()
	m.logConflicts(appeared, resolved)
	if changed {
		m.cfg.Logger.Info("membership changed", "alive", alive, "eligible", eligible)
		select {
		case m.changed <- struct{}{}:
		default:
		}
	}
	return recheck
}

// healthFor returns the health, for source, of the members that relay it.
func healthFor(health map[string]Health, source string) map[string]Health {
	out := make(map[string]Health, len(health))
	for name, h := range health {
		if hs, ok := h.For(source); ok {
			out[name] = hs
		}
	}
	return out
}

func stateName(s memberlist.NodeStateType) string {
	switch s {
	case memberlist.StateAlive:
		return "alive"
	case memberlist.StateSuspect:
		return "suspect"
	case memberlist.StateDead, memberlist.StateLeft:
		return "gone"
	}
	return "unknown"
}
