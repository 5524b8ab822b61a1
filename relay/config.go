package relay

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/confcheck"
)

// Config configures a Relay. Start from DefaultConfig, set Node, change
// what needs changing, and hand it to New, which gives every zero field
// (but RetentionAge, where zero means "keep forever") its DefaultConfig
// value and then calls Validate.
type Config struct {
	// Node is this node's name: the lease owner every write is checked
	// against. Required; there is no default. It must be the name the
	// Ownership leases are held under, and stay the same across restarts.
	Node string

	// Window is W, the most messages the node has published and not yet
	// marked (so at most W are republished after a crash, and a node
	// paused past its lease may duplicate at most W). 1..65535; the
	// default is 512. Throughput per node is about W / confirm latency:
	// raise it for a broker far away, lower it to bound duplicates.
	Window int

	// BatchSize is the most rows one read returns for one partition;
	// reads of many partitions at once take fewer of each. The default is
	// 512. Larger batches cost fewer reads on a deep backlog and more
	// memory and read time per read.
	BatchSize int

	// ReadAheadBytes bounds the rows held in memory: read ahead and not
	// yet published, or published and not yet marked. Reads stop while it
	// is exceeded; one row is always allowed, however large. The default
	// is 16 MiB. Raise it for large payloads with a large Window.
	ReadAheadBytes int64

	// PollInterval is how often the relay reads every partition without a
	// notification: the safety net, and the slowest poll of a partition a
	// producer's open transaction keeps from being armed (an idle relay is
	// notified of a commit at once; a busy one polls every few
	// milliseconds: wake.go). The default is 1 s. Shorter polls cost reads
	// on an idle database.
	PollInterval time.Duration

	// ReadTimeout bounds one read. A read slower than this fails, and is
	// logged like a database outage, instead of running on while the
	// leases it reads for may lapse. The default is 1 s. Keep it well
	// below the lease TTL: the node sets it to TTL/2.
	ReadTimeout time.Duration

	// RetryMin and RetryMax bound the capped exponential backoff (with
	// jitter) of a key whose head was nacked, returned or failed. The
	// defaults are 100 ms and 30 s; RetryMax must not be below RetryMin.
	// Lower RetryMax to retry a failing key sooner, at the cost of more
	// attempts against a broker that keeps refusing.
	RetryMin, RetryMax time.Duration

	// SettleTimeout bounds how long Run waits, when stopping, for
	// outstanding confirms; rows still unconfirmed then stay pending and
	// are published again by the next owner. The default is 5 s.
	SettleTimeout time.Duration

	// MaxAttempts is how many failed attempts park a message. A parked
	// message, and every later message of its key, waits for an operator
	// (retry or skip). The default is 5.
	MaxAttempts int

	// RetentionAge is how long processed rows are kept; 0 keeps them
	// forever. Dead (skipped) rows stay until purged. The default is 24 h.
	RetentionAge time.Duration

	// RetentionInterval is how often retention runs (the default is one
	// minute); RetentionChunk is the most rows one DELETE removes (the
	// default is 1000), so that no statement holds its locks for long.
	RetentionInterval time.Duration
	RetentionChunk    int

	// Logger receives outage and progress messages; nil means
	// slog.Default().
	Logger *slog.Logger

	// Budget, when set, is a confirm window and read-ahead budget the
	// relay shares with the other relays of its node (one per source):
	// its flights and bytes count against the Budget's too, which shares
	// them fairly and lets a busy relay use what the others leave
	// (budget.go). Window and ReadAheadBytes still bound the relay alone.
	// Nil, the default, is a relay alone on its publisher.
	Budget *Budget

	// TracerProvider, when set, gives every publish a PRODUCER span
	// (tracing.go): a child of the trace context the row stored, whose
	// own context the message carries in its traceparent header. Nil, the
	// default, turns tracing off; the stored traceparent is then sent as
	// it is.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults: every field but Node (required)
// and Logger (slog.Default()).
func DefaultConfig() Config {
	return Config{
		Window:            512,
		BatchSize:         512,
		ReadAheadBytes:    16 << 20,
		PollInterval:      time.Second,
		ReadTimeout:       time.Second,
		RetryMin:          100 * time.Millisecond,
		RetryMax:          30 * time.Second,
		SettleTimeout:     5 * time.Second,
		MaxAttempts:       5,
		RetentionAge:      24 * time.Hour,
		RetentionInterval: time.Minute,
		RetentionChunk:    1000,
	}
}

// withDefaults returns c with every zero field but RetentionAge set to
// its DefaultConfig value.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	confcheck.Fill(&c.Window, d.Window)
	confcheck.Fill(&c.BatchSize, d.BatchSize)
	confcheck.Fill(&c.ReadAheadBytes, d.ReadAheadBytes)
	confcheck.Fill(&c.PollInterval, d.PollInterval)
	confcheck.Fill(&c.ReadTimeout, d.ReadTimeout)
	confcheck.Fill(&c.RetryMin, d.RetryMin)
	confcheck.Fill(&c.RetryMax, d.RetryMax)
	confcheck.Fill(&c.SettleTimeout, d.SettleTimeout)
	confcheck.Fill(&c.MaxAttempts, d.MaxAttempts)
	confcheck.Fill(&c.RetentionInterval, d.RetentionInterval)
	confcheck.Fill(&c.RetentionChunk, d.RetentionChunk)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every unusable setting of c as it stands (it does not
// fill zero fields, as New does), joined; each is a *confcheck.Problem
// naming its field.
func (c Config) Validate() error {
	ck := confcheck.New("relay")
	ck.Require(c.Node != "", "Node", "is empty; the node's name is required")
	ck.Require(c.Window >= 1 && c.Window <= 65535, "Window", "%d is out of range 1..65535", c.Window)
	ck.Require(c.BatchSize >= 1, "BatchSize", "%d is below 1", c.BatchSize)
	ck.Require(c.ReadAheadBytes >= 1, "ReadAheadBytes", "%d is below 1", c.ReadAheadBytes)
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"PollInterval", c.PollInterval}, {"ReadTimeout", c.ReadTimeout}, {"RetryMin", c.RetryMin},
		{"SettleTimeout", c.SettleTimeout}, {"RetentionInterval", c.RetentionInterval},
	} {
		ck.Require(d.v > 0, d.field, "%v is not positive", d.v)
	}
	ck.Require(c.RetryMax >= c.RetryMin, "RetryMax", "%v is below RetryMin (%v)", c.RetryMax, c.RetryMin)
	ck.Require(c.MaxAttempts >= 1, "MaxAttempts", "%d is below 1", c.MaxAttempts)
	ck.Require(c.RetentionAge >= 0, "RetentionAge", "%v is negative (0 keeps rows forever)", c.RetentionAge)
	ck.Require(c.RetentionChunk >= 1, "RetentionChunk", "%d is below 1", c.RetentionChunk)
	return ck.Err()
}
