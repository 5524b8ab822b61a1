// Package node composes one Ordo relay node: gossip membership, partition
// assignment, leases, the relay, the AMQP publisher and the HTTP endpoints.
// cmd/node parses flags into a Config and calls Run; tests run several
// nodes in one process the same way.
package node

import (
	"log/slog"
	"os"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/confcheck"
	"github.com/ordo-relay/ordo/lease"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/tablesource"
)

// Config is everything a node is configured with: the node's own
// settings at the top, and what may be set of the relay, the RabbitMQ
// publisher and gossip membership nested (Relay, AMQP, Gossip). The node
// builds those components' configs from them, deriving the rest from its
// own settings: the node name, the publisher's window (Relay.Window), and
// timeouts that follow the lease TTL. Start from DefaultConfig, change
// what needs changing, and call Run, which calls Validate first.
type Config struct {
	// NodeName is the lease owner and gossip name. It must be unique in
	// the cluster and stay the same across restarts, so that a restarted
	// node finds its leases. The default is the host name.
	NodeName string

	// PostgresURL is the outbox database, as pgx parses it (multi-host
	// URLs with target_session_attrs=read-write follow a failover). The
	// default is the local server's postgres database. It is the
	// one-source form: the node relays it as the source named "default"
	// (wire.DefaultSource), unless Sources is set, which replaces it.
	PostgresURL string

	// Sources are the outbox databases the node relays, at most
	// MaxSources, each with a unique name (see Source). Empty, the
	// default, means PostgresURL alone, named "default". When set,
	// PostgresURL is not used; to add a source to a cluster that ran the
	// one-source form, name its database "default" here, so that its
	// keys keep their identity for consumers. Every node of a cluster
	// should list the same sources; adding or removing one is a rolling
	// restart (a node relays only the sources it lists, and gossip tells
	// the others which those are).
	Sources []Source

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
	// after it stopped renewing. The node derives its other timeouts from
	// it by one rule (lease.Timing): the health hold is half of it, the
	// reconnect cap a quarter. At least 300ms, and at least four times
	// AMQP.ReconnectMin (400ms by default); the default is 2 s. Use 5-10 s
	// for a database that can fail over.
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

	// TableLayout, when set, makes the node relay a table Ordo did not
	// create instead of its own outbox (docs/adopt.md): a table layout
	// spec (tablesource.ParseLayout), a preset's name, "article" (the
	// article's EF Core "OutboxMessages", tablesource.Article), and or
	// key=column items separated by ";" for a table whose names differ
	// ("article;table=outbox_messages;correlation_id=AggregateId"). The
	// one-source form only.
	// Empty, the default, relays Ordo's own outbox table.
	TableLayout string

	// TableExchange is the exchange an adopted table's messages are
	// published to (with TableLayout); the default is bookstore.ordering,
	// the article's exchange.
	TableExchange string

	// TablePollMin and TablePollMax bound the wait between two fast
	// passes of an adopted table's intake: TablePollMin while rows keep
	// arriving, doubling to TablePollMax while none do (docs/adopt.md,
	// "Intake"). TablePollMin is what a row waits for at most between
	// two passes, and each pass costs PostgreSQL about the same whatever
	// it takes in: a longer one trades latency for fewer, larger takes.
	TablePollMin time.Duration
	TablePollMax time.Duration

	// TableProbeInterval is how often the intake of an adopted table
	// that has found no new rows asks whether one is pending, between
	// passes that back off to 200 ms (docs/adopt.md, "Intake"): the
	// latency of a quiet table's rows against a round trip per interval
	// while it is idle. 0 turns the probe off.
	TableProbeInterval time.Duration

	// Relay configures the relay: the confirm window W, batches, read
	// ahead, backoff, parking and retention.
	Relay RelayConfig

	// AMQP configures the RabbitMQ publisher: the broker URL and its
	// timeouts. The default URL is the local broker's.
	AMQP AMQPConfig

	// Gossip configures membership. An empty Gossip.BindAddr, the
	// default, runs the node alone, without gossip: it wants every
	// partition. A gossiping node needs a key (Gossip.Keys) or
	// Gossip.Insecure.
	Gossip GossipConfig
}

// DefaultConfig returns settings that work against the local servers,
// for a node named after its host.
func DefaultConfig() Config {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "ordo-node"
	}
	amqpCfg := defaultAMQP()
	return Config{
		NodeName:           name,
		PostgresURL:        "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		HTTPAddr:           "127.0.0.1:8081",
		Partitions:         partition.DefaultCount,
		DBMaxConns:         6,
		LeaseTTL:           lease.DefaultTTL,
		DegradedAfter:      10 * time.Second,
		BacklogInterval:    time.Second,
		TableExchange:      DefaultTableExchange,
		TablePollMin:       tablesource.DefaultPollMin,
		TablePollMax:       tablesource.DefaultPollMax,
		TableProbeInterval: tablesource.DefaultProbeEvery,
		Relay:              relaySettings(relay.DefaultConfig()),
		AMQP:               amqpCfg,
		Gossip:             gossipSettings(membership.DefaultConfig()),
	}
}

// Validate reports every unusable setting, joined: the node's own, the
// cross-field ones, and the problems of the components' configs as the
// node builds them, re-rooted ("Relay.Window"); a problem of a value the
// node derives is reported at the node's field it is derived from. Each
// is a *confcheck.Problem naming its field. Validate changes nothing.
func (c Config) Validate() error {
	ck := confcheck.New("node")
	ck.Require(c.NodeName != "", "NodeName", "is empty; name the node, and keep the name across restarts")
	c.validateSources(ck)
	err := partition.ValidateCount(c.Partitions)
	ck.Require(err == nil, "Partitions", "%v", err)
	ck.Require(c.DBMaxConns >= 3, "DBMaxConns", "%d is below 3 (reads, marks, status)", c.DBMaxConns)
	ck.Require(c.LeaseTTL >= 300*time.Millisecond, "LeaseTTL", "%v is too short (at least 300ms)", c.LeaseTTL)
	if c.LeaseTTL >= 300*time.Millisecond {
		c.validateTiming(ck)
	}
	ck.Require(c.BacklogInterval >= 100*time.Millisecond, "BacklogInterval", "%v is too short (at least 100ms)", c.BacklogInterval)
	c.validateTable(ck)
	ck.Require(c.DegradedAfter >= 0, "DegradedAfter", "%v is negative (0 turns the check off)", c.DegradedAfter)
	ck.Require(c.Gossip.BindAddr != "" || len(c.Gossip.Join) == 0, "Gossip.Join",
		"join addresses need a gossip address (Gossip.BindAddr)")
	if g := c.Gossip; g.BindAddr != "" {
		ck.Require(len(g.Keys) > 0 || g.Insecure, "Gossip.Keys", "%s", msgNoGossipKey)
		ck.Require(len(g.Keys) == 0 || !g.Insecure, "Gossip.Insecure", "contradicts Gossip.Keys: drop Gossip.Insecure to gossip encrypted")
	}
	// The sources of derived values are checked above (and Relay before
	// AMQP): a derived value is only as good as its source.
	ck.Nest("Relay", c.relayConfig(nil).Validate(), relayDerived...)
	amqpFrom := amqpDerived
	if c.AMQP.ReconnectMax == 0 {
		amqpFrom = append(slices.Clip(amqpFrom), confcheck.From{Field: "ReconnectMax", Source: "LeaseTTL"})
	}
	ck.Nest("AMQP", c.amqpConfig(nil).Validate(), amqpFrom...)
	if c.Gossip.BindAddr != "" {
		ck.Nest("Gossip", c.membershipConfig(nil, nil).Validate(), gossipDerived...)
	}
	return ck.Err()
}

// timing returns the lease timing rule for LeaseTTL (lease.TimingFor),
// with the reconnect cap the user set, if any (AMQP.ReconnectMax).
func (c Config) timing() lease.Timing {
	t := lease.TimingFor(c.LeaseTTL)
	if c.AMQP.ReconnectMax != 0 {
		t.ReconnectMax = c.AMQP.ReconnectMax
	}
	return t
}

// validateTiming checks the lease timing rule: every interval derived
// from LeaseTTL keeps it by construction, so what can break it is a
// reconnect cap the user set (reported at AMQP.ReconnectMax), or a TTL
// whose own cap is below AMQP.ReconnectMin (reported at LeaseTTL).
func (c Config) validateTiming(ck *confcheck.Checker) {
	t := c.timing()
	for _, p := range confcheck.Problems(t.Validate()) {
		field := "LeaseTTL"
		if p.Field == "ReconnectMax" && c.AMQP.ReconnectMax != 0 {
			field = "AMQP.ReconnectMax"
		}
		ck.Require(false, field, "%s", p.Msg)
	}
	if c.AMQP.ReconnectMax == 0 && c.AMQP.ReconnectMin > 0 {
		ck.Require(t.ReconnectMax >= c.AMQP.ReconnectMin, "LeaseTTL",
			"%v allows a reconnect cap of at most %v (a quarter of it, so that nodes coming back from an outage they all "+
				"saw stay within its health hold of each other), below AMQP.ReconnectMin (%v); use at least %v",
			c.LeaseTTL, t.ReconnectMax, c.AMQP.ReconnectMin, 4*c.AMQP.ReconnectMin)
	}
}

// msgNoGossipKey says why a gossiping node needs a key.
const msgNoGossipKey = "is empty, and Gossip.Insecure is not set: without a key any host that reaches the gossip address " +
	"(Gossip.BindAddr) joins the cluster and takes partitions; generate one with `openssl rand -base64 32`, " +
	"or set Gossip.Insecure to gossip unencrypted on a network you trust"

// Options are what a program embedding the node may give Run besides its
// Config; the zero value is fine.
type Options struct {
	// Logger receives everything; nil means slog.Default().
	Logger *slog.Logger
	// Ready, if set, is called once with the HTTP address when serving
	// (useful with HTTPAddr port 0).
	Ready func(httpAddr string)
	// TracerProvider, when set, traces every publish (relay.Config's
	// TracerProvider); nil turns tracing off. cmd/node builds it from the
	// OTEL_* environment.
	TracerProvider trace.TracerProvider
}
