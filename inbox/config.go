package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Mode says how the inbox treats a key_seq it did not expect.
type Mode int

const (
	// Ordered is the default: a message is handled when its
	// x-ordo-prev-key-seq is the key's last handled key_seq (0 for a key
	// never seen), dropped when its key_seq is not above it, and stored as
	// a gap otherwise, until the missing messages arrive.
	Ordered Mode = iota
	// Bootstrap is Ordered except for keys the inbox has never seen: their
	// first message is handled whatever its x-ordo-prev-key-seq, so a new
	// consumer can join an existing stream mid-history. Turn it on for the
	// first run over an existing stream and off afterwards: while it is
	// on, a key whose first messages were lost starts after them silently.
	Bootstrap
	// Partial is for a queue bound to only some of a key's messages (gaps
	// by design): a key_seq not above the last handled one is dropped, any
	// other is handled at once. There are no gaps and no stuck keys.
	Partial
)

func (m Mode) String() string {
	switch m {
	case Ordered:
		return "ordered"
	case Bootstrap:
		return "bootstrap"
	case Partial:
		return "partial"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses the String form of a Mode.
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{Ordered, Bootstrap, Partial} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("inbox mode %q: want ordered, bootstrap or partial", s)
}

// Config configures a Consumer (and, through its first fields, a Store).
// Build one with DefaultConfig, then edit it; New calls Validate.
type Config struct {
	// Name is the consumer group: it keys every inbox row and names the
	// broker objects (<Name>.shard.<i>, <Name>.dead, ...). Lower-case
	// letters, digits, '.', '_' and '-'; at most 100 bytes.
	Name string
	// Instance names this process: lease owner and member row. Keep it
	// unique per live process; default host name plus process id.
	Instance string
	// Mode is Ordered, Bootstrap or Partial.
	Mode Mode
	// MaxAttempts (M) is how many handler attempts a message gets before it
	// is dead-lettered and its key held. A crash counts: an attempt is
	// recorded before the handler runs whenever the inbox cannot rule out
	// an earlier one (a redelivery, a stored retry).
	MaxAttempts int
	// RetryMin and RetryMax bound the backoff between attempts of a failing
	// message (exponential from RetryMin, jittered, capped at RetryMax).
	RetryMin, RetryMax time.Duration
	// GapWait is how long a stored gap may wait for the missing message
	// before its key is reported stuck.
	GapWait time.Duration

	// AMQPURL is the broker.
	AMQPURL string
	// Exchange is the source exchange Ordo publishes to; the consumer binds
	// its own headers exchange to it with Bindings.
	Exchange string
	// Bindings are the routing keys bound from Exchange. Default "#".
	Bindings []string
	// Shards (S) is how many shard queues the messages are spread over;
	// fixed at install (stored in the database). Default 8.
	Shards int
	// Partitions (P) is the producer's partition count, needed to bind each
	// partition to its shard. Default 64.
	Partitions int
	// Prefetch bounds the unacknowledged deliveries per shard. Default 32.
	Prefetch int
	// Heartbeat is the AMQP heartbeat: a paused or cut-off instance's
	// exclusive consumers are released by the broker after about two of
	// them, which is when a new owner can attach. Default 10s.
	Heartbeat time.Duration

	// LeaseTTL is how long a shard lease lasts without renewal; renewed
	// every LeaseTTL/3. It also bounds how long a handler transaction may
	// sit idle (idle_in_transaction_session_timeout), so that a paused
	// instance cannot hold a key's row lock past its lease. Default 5s.
	LeaseTTL time.Duration
	// RetryPoll is how often each shard worker looks for stored messages
	// whose retry is due. Default 200ms.
	RetryPoll time.Duration

	// RetentionAge is the redelivery bound: keys idle longer than this are
	// deleted, behind a low-water mark. 0 keeps every key. Default 0.
	RetentionAge time.Duration
	// RetentionInterval is how often retention runs. Default 1m.
	RetentionInterval time.Duration

	// Logger receives ownership, outage and dead-letter messages.
	Logger *slog.Logger

	// AfterCommit, if set, is called after a delivery's outcome has been
	// committed and before the delivery is acknowledged. It exists for
	// fault injection (a test kills the process there); leave it nil.
	AfterCommit func(m *Message, o Outcome)

	// TracerProvider, when set, gives every delivery a CONSUMER span that
	// continues the trace of its traceparent header (the relay's PRODUCER
	// span), and every handler run a span of its own inside it
	// (tracing.go). Nil, the default, turns tracing off.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults for consumer group name.
func DefaultConfig(name string) Config {
	host, _ := os.Hostname()
	return Config{
		Name:              name,
		Instance:          fmt.Sprintf("%s-%d", host, os.Getpid()),
		MaxAttempts:       5,
		RetryMin:          100 * time.Millisecond,
		RetryMax:          30 * time.Second,
		GapWait:           time.Minute,
		AMQPURL:           "amqp://guest:guest@127.0.0.1:5672/",
		Bindings:          []string{"#"},
		Shards:            8,
		Partitions:        64,
		Prefetch:          32,
		Heartbeat:         10 * time.Second,
		LeaseTTL:          5 * time.Second,
		RetryPoll:         200 * time.Millisecond,
		RetentionInterval: time.Minute,
	}
}

// LocalConfig is DefaultConfig with short timings for tests and demos.
func LocalConfig(name string) Config {
	c := DefaultConfig(name)
	c.LeaseTTL = 2 * time.Second
	c.RetryMin = 20 * time.Millisecond
	c.RetryMax = 500 * time.Millisecond
	c.RetryPoll = 50 * time.Millisecond
	c.GapWait = 2 * time.Second
	c.Heartbeat = 2 * time.Second
	return c
}

var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,99}$`)

// Validate checks c and fills in a nil Logger.
func (c *Config) Validate() error {
	switch {
	case !validName.MatchString(c.Name):
		return fmt.Errorf("inbox config: Name %q: want 1-100 of a-z 0-9 . _ -, starting with a letter or digit", c.Name)
	case c.Instance == "":
		return errors.New("inbox config: Instance is required")
	case c.Mode < Ordered || c.Mode > Partial:
		return fmt.Errorf("inbox config: unknown %v", c.Mode)
	case c.MaxAttempts < 1:
		return fmt.Errorf("inbox config: MaxAttempts %d must be at least 1", c.MaxAttempts)
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return fmt.Errorf("inbox config: RetryMin %v must be positive and at most RetryMax %v", c.RetryMin, c.RetryMax)
	case c.GapWait <= 0:
		return errors.New("inbox config: GapWait must be positive")
	case c.Shards < 1 || c.Shards > 1024:
		return fmt.Errorf("inbox config: Shards %d out of range 1..1024", c.Shards)
	case c.Partitions < 1 || c.Partitions > 1<<16:
		return fmt.Errorf("inbox config: Partitions %d out of range 1..65536", c.Partitions)
	case c.Prefetch < 1 || c.Prefetch > 65535:
		return fmt.Errorf("inbox config: Prefetch %d out of range 1..65535", c.Prefetch)
	case c.Heartbeat < time.Second:
		return fmt.Errorf("inbox config: Heartbeat %v must be at least 1s", c.Heartbeat)
	case c.LeaseTTL < 300*time.Millisecond:
		return fmt.Errorf("inbox config: LeaseTTL %v must be at least 300ms", c.LeaseTTL)
	case c.RetryPoll <= 0:
		return errors.New("inbox config: RetryPoll must be positive")
	case c.RetentionAge < 0:
		return errors.New("inbox config: RetentionAge must not be negative")
	case c.RetentionAge > 0 && c.RetentionInterval <= 0:
		return errors.New("inbox config: RetentionInterval must be positive when RetentionAge is set")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// backoff returns the wait after the attempts-th failed attempt.
func (c *Config) backoff(attempts int, jitter float64) time.Duration {
	d := c.RetryMin
	for i := 1; i < attempts && d < c.RetryMax; i++ {
		d *= 2
	}
	d = min(d, c.RetryMax)
	// jitter in [0,1): spread retries of many keys over [d/2, d).
	return d/2 + time.Duration(float64(d/2)*jitter)
}
