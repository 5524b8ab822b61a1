package node

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/internal/backoff"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/wire"
)

// healthMonitor watches this node's own dependencies and tells gossip, so
// that a node cut off from its broker or its database steps aside for a
// healthier peer (membership.Eligible), and takes its share back when it
// is healthy again. Each source's database is watched on its own: a node
// cut off from one source steps aside for that source's partitions only
// (membership.EligibleFor).
//
//   - A source whose schema is not migrated yet (its database did not
//     answer at start: migrations) is unreachable, whatever its pings
//     say: the node has not started its leaser, so gossip must leave it
//     out of that source's map.
//   - A database is reachable while a ping on a connection of its own
//     has succeeded within dbWindow (the lease TTL minus its margin,
//     lease.Timing's DatabaseWindow, as every interval here): the
//     node declares the database lost when its leases lapse, not later.
//     A stalled link is caught like a closed one: no ping answers (each
//     is bounded by dbWindow, then its connection is replaced).
//   - The broker is reachable while the publisher has a channel open; a
//     change counts once it has lasted brokerGrace, so a channel reopened
//     after a 404 moves nothing. A stalled link is caught by the
//     publisher itself (no confirm within its stall timeout closes it),
//     or by the heartbeat. A resource alarm does not count: it blocks
//     every node's publishing, but RabbitMQ tells only the connections
//     that publish, so counting it would move partitions to idle nodes
//     that are about to be blocked too.
type healthMonitor struct {
	broker      broker
	dbs         []*dbPing
	perSource   bool                   // gossip each source's reachability (Health.Sources)
	members     *membership.Membership // nil when the node runs alone
	every       time.Duration          // how often to ping and look
	dbWindow    time.Duration
	brokerGrace time.Duration
	redialMax   time.Duration // the cap of a ping's reconnect backoff
	logger      *slog.Logger

	mu     sync.Mutex
	health membership.Health
}

// dbPing is the database half of one source's health.
type dbPing struct {
	name     string
	connect  func(ctx context.Context) (*pgx.Conn, error)
	migrated func() bool   // false until the source's schema is migrated: unreachable till then
	identity func() string // its database's token (membership.DatabaseIdentity), read once migrated
	lastPing atomic.Int64  // unix nanoseconds when the last successful ping was sent
}

func newHealthMonitor(cfg Config, br broker, srcs []*source,
	members *membership.Membership, logger *slog.Logger) *healthMonitor {
	t := cfg.timing()
	h := &healthMonitor{
		broker: br, members: members, logger: logger,
		every: t.HealthEvery, dbWindow: t.DatabaseWindow, brokerGrace: t.BrokerGrace, redialMax: t.ReconnectMax,
		health:    membership.Healthy,
		perSource: len(srcs) > 1 || srcs[0].name != wire.DefaultSource,
	}
	for _, s := range srcs {
		d := &dbPing{name: s.name, connect: s.connect, migrated: s.isMigrated, identity: func() string { return s.idToken }}
		d.lastPing.Store(time.Now().UnixNano()) // healthy until shown otherwise
		h.dbs = append(h.dbs, d)
	}
	// Advertise the sources before gossip joins (a change from Healthy,
	// which names none), leaving out those not migrated yet (compute).
	h.set(h.compute(time.Now(), true))
	return h
}

// compute returns the node's health at now, the broker as given.
//
// A source not migrated yet is left out of the sources the node lists,
// as if it did not know it: a peer then leaves the node out of that
// source's map at once (membership.Health.For). Listed as unreachable
// ("!billing"), a peer that first saw the node that way counted its hold
// from then, kept it eligible for the health hold and handed it a share of the
// source that nobody claimed until the hold ran out
// (TestSourceNotMigratedLeftOutOfMap). Database is false while one is.
func (h *healthMonitor) compute(now time.Time, broker bool) membership.Health {
	states := make([]membership.SourceState, 0, len(h.dbs))
	migrated := true
	for _, d := range h.dbs {
		fresh := now.Sub(time.Unix(0, d.lastPing.Load())) < h.dbWindow
		if !d.migrated() {
			migrated = false
			continue
		}
		// The identity was read before the source was migrated: it
		// does not change while the node runs.
		states = append(states, membership.SourceState{Name: d.name, Reachable: fresh, Identity: d.identity()})
	}
	if !h.perSource || len(states) == 0 {
		hl := membership.Health{Broker: broker, Database: len(states) > 0 && states[0].Reachable}
		if len(states) > 0 {
			hl.IDs = states[0].Identity
		}
		return hl
	}
	hl := membership.SourcesHealth(broker, states)
	hl.Database = hl.Database && migrated
	return hl
}

// Reachable reports whether source's database is reachable, as the node
// last said.
func (h *healthMonitor) Reachable(source string) bool {
	hl, ok := h.Health().For(source)
	return ok && hl.Database
}

// Health returns what the node last said of itself. Safe for concurrent
// use.
func (h *healthMonitor) Health() membership.Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.health
}

// Run pings the database and watches the publisher until ctx ends.
func (h *healthMonitor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, d := range h.dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.pingLoop(ctx, d)
		}()
	}
	defer wg.Wait()
	t := time.NewTicker(h.every)
	defer t.Stop()
	var broker debounce
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			h.set(h.compute(now, broker.update(now, h.broker.State().Connected, h.brokerGrace)))
		}
	}
}

func (h *healthMonitor) set(hl membership.Health) {
	h.mu.Lock()
	changed := h.health != hl
	h.health = hl
	h.mu.Unlock()
	if !changed {
		return
	}
	if h.members != nil {
		h.members.SetHealth(hl) // logs the change
		return
	}
	h.logger.Info("this node's health changed", "broker", hl.Broker, "database", hl.Database, "sources", hl.Sources)
}

// pingLoop pings d's database every h.every on a connection of its own,
// until ctx ends. A ping may take up to dbWindow: the verdict (compute)
// goes by when the last successful ping was sent, so a slower bound
// delays nothing, and a ping that merely ran long does not cost the
// connection. A connect has the source's own bound (source.connect), and
// a failed one is tried again after a backoff with jitter, capped as the
// broker's reconnects are (lease.Timing's ReconnectMax), so that nodes
// coming back from an outage they all saw say so within the health hold
// of each other. Connects given up every h.every and started over would
// each cost the server a session start, every node's and every source's
// at once after a restart, and keep a slow server slow.
func (h *healthMonitor) pingLoop(ctx context.Context, d *dbPing) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
	}()
	bo := backoff.New(h.every, max(h.every, h.redialMax))
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		if conn == nil || conn.IsClosed() {
			c, err := d.connect(ctx)
			if err != nil {
				if !backoff.Sleep(ctx, bo.Next()) {
					return
				}
				continue
			}
			conn = c
			bo.Reset()
		}
		sent := time.Now()
		pctx, cancel := context.WithTimeout(ctx, h.dbWindow)
		err := conn.Ping(pctx)
		cancel()
		if err == nil {
			d.lastPing.Store(sent.UnixNano())
		} else {
			cctx, cancel := context.WithTimeout(context.Background(), h.every)
			_ = conn.Close(cctx)
			cancel()
			conn = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// debounce reports a boolean that changes only once the raw value has
// differed from it for a grace period. Its zero value reports true.
type debounce struct {
	off   bool      // the reported value, negated (zero value: true)
	since time.Time // when raw started to differ from it; zero if it does not
}

func (d *debounce) update(now time.Time, raw bool, grace time.Duration) bool {
	if raw == !d.off {
		d.since = time.Time{}
		return raw
	}
	if d.since.IsZero() {
		d.since = now
	}
	if now.Sub(d.since) >= grace {
		d.off, d.since = !raw, time.Time{}
	}
	return !d.off
}
