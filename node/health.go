package node

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// healthMonitor watches this node's own dependencies and tells gossip, so
// that a node cut off from its broker or its database steps aside for a
// healthier peer (membership.Eligible), and takes its share back when it
// is healthy again.
//
//   - The database is reachable while a ping on a connection of its own
//     has succeeded within dbWindow (the lease TTL minus its margin): the
//     node declares the database lost when its leases lapse, not later.
//     A stalled link is caught by the ping's timeout, like a closed one.
//   - The broker is reachable while the publisher has a channel open; a
//     change counts once it has lasted brokerGrace, so a channel reopened
//     after a 404 moves nothing. A stalled link is caught by the
//     publisher itself (no confirm within its stall timeout closes it),
//     or by the heartbeat. A resource alarm does not count: it blocks
//     every node's publishing, but RabbitMQ tells only the connections
//     that publish, so counting it would move partitions to idle nodes
//     that are about to be blocked too.
type healthMonitor struct {
	pub         *rabbitmq.Publisher
	connect     func(ctx context.Context) (*pgx.Conn, error)
	members     *membership.Membership // nil when the node runs alone
	every       time.Duration          // how often to ping and look
	dbWindow    time.Duration
	brokerGrace time.Duration
	logger      *slog.Logger

	lastPing atomic.Int64 // unix nanoseconds when the last successful ping was sent

	mu     sync.Mutex
	health membership.Health
}

func newHealthMonitor(cfg Config, pub *rabbitmq.Publisher, connect func(context.Context) (*pgx.Conn, error),
	members *membership.Membership, logger *slog.Logger) *healthMonitor {
	h := &healthMonitor{
		pub: pub, connect: connect, members: members, logger: logger,
		every:       max(cfg.LeaseTTL/8, 20*time.Millisecond),
		dbWindow:    cfg.LeaseTTL - cfg.LeaseTTL/4,
		brokerGrace: cfg.LeaseTTL / 4,
		health:      membership.Healthy,
	}
	h.lastPing.Store(time.Now().UnixNano()) // healthy until shown otherwise
	return h
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
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.pingLoop(ctx)
	}()
	defer wg.Wait()
	t := time.NewTicker(h.every)
	defer t.Stop()
	var broker debounce
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			hl := membership.Health{
				Broker:   broker.update(now, h.pub.Status().Connected, h.brokerGrace),
				Database: now.Sub(time.Unix(0, h.lastPing.Load())) < h.dbWindow,
			}
			h.set(hl)
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
	h.logger.Info("this node's health changed", "broker", hl.Broker, "database", hl.Database)
}

// pingLoop pings the database every h.every on a connection of its own,
// each ping and each connect bounded by h.every, until ctx ends.
func (h *healthMonitor) pingLoop(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
	}()
	t := time.NewTicker(h.every)
	defer t.Stop()
	for {
		sent := time.Now()
		pctx, cancel := context.WithTimeout(ctx, h.every)
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = h.connect(pctx)
		}
		if err == nil {
			err = conn.Ping(pctx)
		}
		cancel()
		if err == nil {
			h.lastPing.Store(sent.UnixNano())
		} else if conn != nil {
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
