// Package node composes one Ordo relay node: gossip membership, partition
// assignment, leases, the relay, the AMQP publisher and the HTTP endpoints.
// cmd/node parses flags into a Config and calls Run; tests run several
// nodes in one process the same way.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/redact"
	"github.com/ordo-relay/ordo/membership"
	"github.com/ordo-relay/ordo/partition"
	"github.com/ordo-relay/ordo/relay"
)

// Config is everything a node is configured with.
type Config struct {
	PostgresURL    string        // outbox database
	AMQPURL        string        // broker, or a comma-separated list of broker nodes tried in turn
	NodeName       string        // lease owner and gossip name; stable across restarts
	HTTPAddr       string        // /healthz, /readyz, /status
	Partitions     int           // P; must match the installed count
	ConfirmWindow  int           // W: most unconfirmed publishes in flight
	BatchSize      int           // most rows per partition per read
	ReadAheadMiB   int           // memory for rows read ahead or unmarked, in MiB
	PollInterval   time.Duration // read without a notification this often
	LeaseTTL       time.Duration // lease lifetime in the database
	SettleTimeout  time.Duration // bound on settling confirms at shutdown
	RetryMin       time.Duration // first backoff of a failed key
	RetryMax       time.Duration // backoff cap
	DBMaxConns     int           // pool size
	MaxAttempts    int           // failed attempts that park a message
	ConfirmTimeout time.Duration // a publish unconfirmed this long on an open channel is a failure

	// RetentionAge is how long processed rows are kept (0: forever);
	// RetentionInterval how often retention runs; RetentionChunk the most
	// rows one DELETE removes.
	RetentionAge      time.Duration
	RetentionInterval time.Duration
	RetentionChunk    int

	// AdminToken is the bearer token of the /admin actions; empty turns
	// them off.
	AdminToken string
	// PProf serves net/http/pprof under /debug/pprof/ on the HTTP address.
	PProf bool

	// DegradedAfter is the oldest pending age, in the partitions the node
	// holds, above which /readyz and /status call the node degraded (still
	// ready); 0 turns the check off.
	DegradedAfter time.Duration
	// BacklogInterval is how often the backlog snapshot (every partition's
	// pending and parked counts and oldest age, for /status and /metrics)
	// is refreshed: one bounded query per interval.
	BacklogInterval time.Duration

	// GossipAddr is the host:port gossip listens on; empty runs the node
	// alone (it wants every partition) without gossip.
	GossipAddr string
	// GossipAdvertise is the host:port peers reach this node at; empty
	// means GossipAddr.
	GossipAdvertise string
	// Join lists seed gossip addresses.
	Join []string
	// GossipKeys are the gossip encryption keys (first encrypts).
	GossipKeys [][]byte
	// RejoinInterval is how often seeds are joined again.
	RejoinInterval time.Duration
}

// DefaultConfig returns settings that work against the local servers.
func DefaultConfig() Config {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "ordo-node"
	}
	return Config{
		PostgresURL:    "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		AMQPURL:        "amqp://guest:guest@127.0.0.1:5672/",
		NodeName:       name,
		HTTPAddr:       "127.0.0.1:8081",
		Partitions:     partition.DefaultCount,
		ConfirmWindow:  512,
		BatchSize:      512,
		ReadAheadMiB:   16,
		PollInterval:   time.Second,
		LeaseTTL:       2 * time.Second,
		SettleTimeout:  5 * time.Second,
		RetryMin:       100 * time.Millisecond,
		RetryMax:       30 * time.Second,
		DBMaxConns:     6,
		MaxAttempts:    5,
		ConfirmTimeout: 30 * time.Second,
		RejoinInterval: 10 * time.Second,

		DegradedAfter:   10 * time.Second,
		BacklogInterval: time.Second,

		RetentionAge:      24 * time.Hour,
		RetentionInterval: time.Minute,
		RetentionChunk:    1000,
	}
}

// Validate reports the first unusable setting.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return errors.New("node name is empty (set -node-name or ORDO_NODE_NAME)")
	case c.DBMaxConns < 3:
		return fmt.Errorf("db-max-conns %d: need at least 3 (reads, marks, status)", c.DBMaxConns)
	case c.LeaseTTL < 300*time.Millisecond:
		return fmt.Errorf("lease-ttl %v is too short (at least 300ms)", c.LeaseTTL)
	case c.BacklogInterval < 100*time.Millisecond:
		return fmt.Errorf("backlog-interval %v is too short (at least 100ms)", c.BacklogInterval)
	case c.DegradedAfter < 0:
		return fmt.Errorf("degraded-after %v is negative", c.DegradedAfter)
	case c.GossipAddr == "" && len(c.Join) > 0:
		return errors.New("join addresses need a gossip address (-gossip-addr)")
	}
	if err := partition.ValidateCount(c.Partitions); err != nil {
		return err
	}
	if c.AMQPURL == "" {
		return errors.New("amqp-url is empty")
	}
	for _, u := range strings.Split(c.AMQPURL, ",") {
		if _, err := amqp.ParseURI(strings.TrimSpace(u)); err != nil {
			// The parse error quotes the whole URL, password included.
			return fmt.Errorf("amqp-url %s does not parse: percent-encode reserved characters (@ : / ? # %%) in the user name and password", redact.URL(u))
		}
	}
	rc := c.relay(nil)
	return rc.Validate()
}

func (c Config) relay(logger *slog.Logger) relay.Config {
	return relay.Config{
		Node: c.NodeName, Window: c.ConfirmWindow, PerKeyLimit: 1, BatchSize: c.BatchSize,
		ReadAheadBytes: int64(c.ReadAheadMiB) << 20,
		PollInterval:   c.PollInterval, ReadTimeout: c.LeaseTTL / 2, RetryMin: c.RetryMin, RetryMax: c.RetryMax, SettleTimeout: c.SettleTimeout,
		MaxAttempts: c.MaxAttempts, RetentionAge: c.RetentionAge, RetentionInterval: c.RetentionInterval,
		RetentionChunk: c.RetentionChunk, Logger: logger,
	}
}

// Options are hooks for tests and embedding; the zero value is fine.
type Options struct {
	// Logger receives everything; nil means slog.Default().
	Logger *slog.Logger
	// GossipTransport replaces memberlist's network transport.
	GossipTransport memberlist.Transport
	// WrapPublisher wraps the AMQP publisher (fault injection in tests).
	WrapPublisher func(relay.Publisher) relay.Publisher
	// Ready, if set, is called once with the HTTP address when serving.
	Ready func(httpAddr string)
	// PerKeyLimit, when above 0, replaces the relay's per-key limit of 1.
	// For tests only: above 1, per-key order is lost under nacks and
	// returns, and the tests that show it set this.
	PerKeyLimit int
}

func (c Config) membership(logger *slog.Logger, tr memberlist.Transport) membership.Config {
	mc := membership.DefaultConfig(c.NodeName, c.GossipAddr)
	mc.AdvertiseAddr = c.GossipAdvertise
	mc.Join = c.Join
	mc.Keys = c.GossipKeys
	if c.RejoinInterval > 0 {
		mc.RejoinInterval = c.RejoinInterval
	}
	mc.Transport = tr
	mc.Logger = logger
	// A node less healthy than a peer for half a lease TTL steps aside;
	// nodes that notice a shared outage within that of each other stay.
	mc.HealthHold = c.LeaseTTL / 2
	return mc
}
