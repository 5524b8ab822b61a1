// Package node composes one Ordo relay node: gossip membership, partition
// assignment, leases, the relay, the AMQP publisher and the HTTP endpoints.
// cmd/node parses flags into a Config and calls Run; tests run several
// nodes in one process the same way.
package node

import (
	"log/slog"
	"os"
	"time"

	"github.com/hashicorp/memberlist"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/rabbitmq"
)

// Config is everything a node is configured with: the node's own
// settings at the top, and the settings of the relay, the RabbitMQ
// publisher and gossip membership nested (Relay, AMQP, Gossip), each
// documented in its package. Start from DefaultConfig, change what needs
// changing, and call Run, which calls Validate first.
//
// The node sets some fields of the nested configs itself, overriding
// what they hold: Relay.Node and Gossip.NodeName (NodeName),
// Relay.PerKeyLimit (1: per-key order), Relay.ReadTimeout and
// Gossip.HealthHold (LeaseTTL/2), AMQP.Window (Relay.Window),
// AMQP.StallTimeout (LeaseTTL), and every Logger (Options.Logger).
type Config struct {
	// NodeName is the lease owner and gossip name. It must be unique in
	// the cluster and stay the same across restarts, so that a restarted
	// node finds its leases. The default is the host name.
	NodeName string

	// PostgresURL is the outbox database, as pgx parses it (multi-host
	// URLs with target_session_attrs=read-write follow a failover). The
	// default is the local server's postgres database.
	PostgresURL string

	// HTTPAddr is where the node serves its page, /healthz, /readyz,
	// /status, /metrics and /admin. The default is 127.0.0.1:8081; use
	// 0.0.0.0:PORT in a container.
	HTTPAddr string

	// Partitions is P, the partition count. It is fixed when the outbox is
	// installed: a node configured with another count refuses to start.
	// 1..4096; the default is 64.
	Partitions int

	// DBMaxConns is the size of the PostgreSQL pool (reads, marks, the
	// backlog snapshot, /status and admin actions; the leaser and health
	// checks hold connections of their own). At least 3; the default is
	// 6.
	DBMaxConns int

	// LeaseTTL is a partition lease's lifetime: renewals run every third
	// of it, and a crashed node's partitions are claimed at most a TTL
	// after it stopped renewing. At least 300ms; the default is 2 s. Use
	// 5-10 s for a database that can fail over.
	LeaseTTL time.Duration

	// AdminToken is the bearer token of the /admin actions; the default,
	// empty, turns them off.
	AdminToken string

	// PProf serves net/http/pprof under /debug/pprof/ on HTTPAddr. Off by
	// default.
	PProf bool

	// DegradedAfter is the oldest pending age, in the partitions the node
	// holds, above which /readyz and /status call the node degraded (still
	// ready). The default is 10 s; 0 turns the check off.
	DegradedAfter time.Duration

	// BacklogInterval is how often the backlog snapshot (every partition's
	// pending and parked counts and oldest age, for /status and /metrics)
	// is refreshed: one bounded query per interval. At least 100ms; the
	// default is 1 s.
	BacklogInterval time.Duration

	// Relay configures the relay: the confirm window W, batches, read
	// ahead, backoff, parking and retention (see relay.Config).
	Relay relay.Config

	// AMQP configures the RabbitMQ publisher: the broker URL (a
	// comma-separated list of broker nodes tried in turn) and its timeouts
	// (see rabbitmq.Config). The default URL is the local broker's.
	AMQP rabbitmq.Config

	// Gossip configures membership (see membership.Config). An empty
	// Gossip.BindAddr, the default, runs the node alone, without gossip:
	// it wants every partition.
	Gossip membership.Config
}

// DefaultConfig returns settings that work against the local servers,
// for a node named after its host.
func DefaultConfig() Config {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "ordo-node"
	}
	amqpCfg := rabbitmq.DefaultConfig()
	amqpCfg.URL = "amqp://guest:guest@127.0.0.1:5672/"
	return Config{
		NodeName:        name,
		PostgresURL:     "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		HTTPAddr:        "127.0.0.1:8081",
		Partitions:      partition.DefaultCount,
		DBMaxConns:      6,
		LeaseTTL:        2 * time.Second,
		DegradedAfter:   10 * time.Second,
		BacklogInterval: time.Second,
		Relay:           relay.DefaultConfig(),
		AMQP:            amqpCfg,
		Gossip:          membership.DefaultConfig(),
	}
}

// Validate reports every unusable setting, joined: the node's own, the
// nested configs' (as the node would use them), and the combinations
// that do not go together. Each is a *confcheck.Problem naming its field,
// e.g. "Relay.Window".
func (c Config) Validate() error {
	ck := confcheck.New("node")
	ck.Require(c.NodeName != "", "NodeName", "is empty; name the node, and keep the name across restarts")
	err := partition.ValidateCount(c.Partitions)
	ck.Require(err == nil, "Partitions", "%v", err)
	ck.Require(c.DBMaxConns >= 3, "DBMaxConns", "%d is below 3 (reads, marks, status)", c.DBMaxConns)
	ck.Require(c.LeaseTTL >= 300*time.Millisecond, "LeaseTTL", "%v is too short (at least 300ms)", c.LeaseTTL)
	ck.Require(c.BacklogInterval >= 100*time.Millisecond, "BacklogInterval", "%v is too short (at least 100ms)", c.BacklogInterval)
	ck.Require(c.DegradedAfter >= 0, "DegradedAfter", "%v is negative (0 turns the check off)", c.DegradedAfter)
	ck.Require(c.Gossip.BindAddr != "" || len(c.Gossip.Join) == 0, "Gossip.Join",
		"join addresses need a gossip address (Gossip.BindAddr)")
	// Fields the node sets itself are checked through their sources above.
	ck.Nest("Relay", c.relay(nil).Validate(), "Node", "PerKeyLimit", "ReadTimeout")
	ck.Nest("AMQP", c.amqp(nil).Validate(), "Window", "StallTimeout")
	if c.Gossip.BindAddr != "" {
		ck.Nest("Gossip", c.membership(nil, nil).Validate(), "NodeName", "HealthHold")
	}
	return ck.Err()
}

// relay returns the relay's config as the node runs it.
func (c Config) relay(logger *slog.Logger) relay.Config {
	rc := c.Relay
	rc.Node, rc.PerKeyLimit, rc.ReadTimeout, rc.Logger = c.NodeName, 1, c.LeaseTTL/2, logger
	return rc
}

// amqp returns the publisher's config as the node runs it. A link that
// confirms nothing for a lease TTL is taken for dead: the node stops
// counting on it long before the heartbeat would.
func (c Config) amqp(logger *slog.Logger) rabbitmq.Config {
	ac := c.AMQP
	ac.Window, ac.StallTimeout, ac.Logger = c.Relay.Window, c.LeaseTTL, logger
	if ac.ConnectionName == "" {
		ac.ConnectionName = "ordo node " + c.NodeName // as the PostgreSQL sessions' application_name
	}
	return ac
}

// Options are hooks for tests and embedding; the zero value is fine.
type Options struct {
	// Logger receives everything; nil means slog.Default().
	Logger *slog.Logger
	// GossipTransport, if set, replaces Gossip.Transport (memberlist's
	// network transport).
	GossipTransport memberlist.Transport
	// WrapPublisher wraps the AMQP publisher (fault injection in tests).
	WrapPublisher func(relay.Publisher) relay.Publisher
	// Ready, if set, is called once with the HTTP address when serving.
	Ready func(httpAddr string)
	// TracerProvider, when set, traces every publish (relay.Config's
	// TracerProvider); nil turns tracing off. cmd/node builds it from the
	// OTEL_* environment.
	TracerProvider trace.TracerProvider
	// PerKeyLimit, when above 0, replaces the relay's per-key limit of 1.
	// For tests only: above 1, per-key order is lost under nacks and
	// returns, and the tests that show it set this.
	PerKeyLimit int
}

// membership returns the membership config as the node runs it; tr, if
// not nil, replaces Gossip.Transport.
func (c Config) membership(logger *slog.Logger, tr memberlist.Transport) membership.Config {
	mc := c.Gossip
	mc.NodeName, mc.Logger = c.NodeName, logger
	if tr != nil {
		mc.Transport = tr
	}
	// A node less healthy than a peer for half a lease TTL steps aside;
	// nodes that notice a shared outage within that of each other stay.
	mc.HealthHold = c.LeaseTTL / 2
	return mc
}
