package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/internal/confcheck"
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
	// first message is handled whatever its x-ordo-prev-key-seq (the key
	// starts at that prev, so the message stays next if it is retried), so
	// a new consumer can join an existing stream mid-history. Turn it on for the
	// first run over an existing stream and off afterwards: while it is
	// on, a key whose first messages were lost starts after them silently.
	Bootstrap
	// Partial is for a queue bound to only some of a key's messages (gaps
	// by design): a key_seq not above the last handled one is dropped, any
	// other is handled at once, unless an earlier message of its key is
	// stored for a retry or dead-lettered: it then waits behind that one,
	// as in every mode. There are no gaps and no stuck keys.
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
	// an earlier one (a redelivery, a stored retry). Every message is run
	// at least once: a redelivery's uncertain attempt is never its last,
	// so with 1 a message is run once and dead-lettered if that fails.
	MaxAttempts int
	// RetryMin and RetryMax bound the backoff between attempts of a failing
	// message (exponential from RetryMin, jittered, capped at RetryMax).
	RetryMin, RetryMax time.Duration
	// GapWait is how long a stored gap may wait for the missing message
	// before its key is reported stuck.
	GapWait time.Duration

	// AMQPURL is the broker (amqps:// for TLS).
	AMQPURL string
	// AMQPConfig holds the AMQP connection settings beyond the URL, for
	// every connection the inbox opens (the shard consumers' and the dead
	// letters'): TLSClientConfig, SASL, Vhost, Dial, ChannelMax, ... Its
	// Heartbeat must be left zero (set Heartbeat instead). A nil Dial
	// dials with a 5 s timeout; a Dial given is called as it is, and the
	// AMQP handshake after it is bounded by the same 5 s. Properties gets
	// a connection_name naming the group and the instance unless it has
	// one.
	AMQPConfig amqp.Config
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
	// Lanes bounds the messages one shard worker handles at once: keys of
	// a shard are handled concurrently, up to Lanes of them, while each key
	// stays serial and in key_seq order. Each busy lane holds one pool
	// connection for its handler's transaction, so size the pool at 2 +
	// Lanes × the shards an instance may own (with a *pgxpool.Pool the
	// lanes of all shards together use at most MaxConns − 2 connections,
	// keeping two for the lease loop: correct, only slower). 1 handles a shard's
	// messages one at a time. At most Prefetch, since a lane needs an
	// unacknowledged delivery to work on. Default 4: with handlers that
	// wait on I/O (a downstream call) an instance's concurrency is then 4×
	// its shards, and the default S = 8 shards need a pool of 34, within
	// what one PostgreSQL serves to a few instances.
	Lanes int
	// BatchSize bounds the deliveries a lane handles in one transaction
	// (group commit): when a lane comes to work, it takes what its keys
	// and the shard's waiting keys have queued, up to BatchSize, runs each
	// message under a savepoint of its own in one transaction, commits
	// once and then acknowledges them. It never waits for more: at low
	// load a batch is the one delivery there is. 1 gives every delivery a
	// transaction of its own. At most 32 (each message may use two
	// subtransactions, and PostgreSQL tracks 64 per transaction cheaply).
	// Default 16.
	BatchSize int
	// BatchTime bounds a batch by its handlers: once they have run this
	// long in all, no further message is added to its transaction; it
	// commits, and the rest of the batch goes on in a new transaction.
	// Handlers that take this long get a transaction each, so a slow
	// handler's locks and acks are not held for a batch. The inbox's own
	// statements do not count: a busy database, where sharing a commit
	// saves the most, does not make the batches smaller. Default 20ms.
	BatchTime time.Duration
	// Heartbeat is the AMQP heartbeat: a paused or cut-off instance's
	// exclusive consumers are released by the broker after about two of
	// them, which is when a new owner can attach. Default 10s.
	Heartbeat time.Duration

	// LeaseTTL is how long a shard lease lasts without renewal. The
	// intervals derived from it are the relay's lease timing rule
	// (lease.TimingFor): renewed every TTL/3, each round bounded by TTL/2,
	// handled under a lease until TTL minus a quarter after the renewal
	// was sent. It also bounds how long a handler transaction may
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

	// Logger receives ownership, outage and dead-letter messages. Nil:
	// slog.Default().
	Logger *slog.Logger

	// TracerProvider, when set, gives every delivery a CONSUMER span that
	// continues the trace of its traceparent header (the relay's PRODUCER
	// span), and every handler run a span of its own inside it
	// (tracing.go). Nil, the default, turns tracing off.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults for consumer group name. New and
// NewStore fill the fields a caller left zero from it.
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
		Lanes:             4,
		BatchSize:         16,
		BatchTime:         20 * time.Millisecond,
		Heartbeat:         10 * time.Second,
		LeaseTTL:          5 * time.Second,
		RetryPoll:         200 * time.Millisecond,
		RetentionInterval: time.Minute,
	}
}

var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,99}$`)

// withDefaults returns c with every zero field set from DefaultConfig
// (c.Name), and a nil Logger set to slog.Default(): the one place
// defaults are filled. Mode's zero is Ordered and RetentionAge's zero
// keeps every key: both stay as they are.
func (c Config) withDefaults() Config {
	d := DefaultConfig(c.Name)
	confcheck.Fill(&c.Instance, d.Instance)
	confcheck.Fill(&c.MaxAttempts, d.MaxAttempts)
	confcheck.Fill(&c.RetryMin, d.RetryMin)
	confcheck.Fill(&c.RetryMax, max(d.RetryMax, c.RetryMin))
	confcheck.Fill(&c.GapWait, d.GapWait)
	confcheck.Fill(&c.AMQPURL, d.AMQPURL)
	if len(c.Bindings) == 0 {
		c.Bindings = d.Bindings
	}
	confcheck.Fill(&c.Shards, d.Shards)
	confcheck.Fill(&c.Partitions, d.Partitions)
	confcheck.Fill(&c.Prefetch, d.Prefetch)
	confcheck.Fill(&c.Lanes, max(1, min(d.Lanes, c.Prefetch)))
	confcheck.Fill(&c.BatchSize, max(1, min(d.BatchSize, c.Prefetch)))
	confcheck.Fill(&c.BatchTime, d.BatchTime)
	confcheck.Fill(&c.Heartbeat, d.Heartbeat)
	confcheck.Fill(&c.LeaseTTL, d.LeaseTTL)
	confcheck.Fill(&c.RetryPoll, d.RetryPoll)
	confcheck.Fill(&c.RetentionInterval, d.RetentionInterval)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every unusable setting of c as it stands (before New
// fills zero fields), joined; each is a *confcheck.Problem naming its
// field. It does not change c.
func (c Config) Validate() error {
	ck := confcheck.New("inbox")
	ck.Require(validName.MatchString(c.Name), "Name", "%q: want 1-100 of a-z 0-9 . _ -, starting with a letter or digit", c.Name)
	ck.Require(c.Instance != "", "Instance", "is empty; the instance's name is required")
	ck.Require(c.Mode >= Ordered && c.Mode <= Partial, "Mode", "unknown %v", c.Mode)
	ck.Require(c.MaxAttempts >= 1, "MaxAttempts", "%d is below 1", c.MaxAttempts)
	ck.Require(c.RetryMin > 0 && c.RetryMax >= c.RetryMin, "RetryMin", "%v must be positive and at most RetryMax %v", c.RetryMin, c.RetryMax)
	ck.Require(c.GapWait > 0, "GapWait", "%v is not positive", c.GapWait)
	ck.Require(c.Shards >= 1 && c.Shards <= 1024, "Shards", "%d out of range 1..1024", c.Shards)
	ck.Require(c.Partitions >= 1 && c.Partitions <= 1<<16, "Partitions", "%d out of range 1..65536", c.Partitions)
	ck.Require(c.Prefetch >= 1 && c.Prefetch <= 65535, "Prefetch", "%d out of range 1..65535", c.Prefetch)
	ck.Require(c.Lanes >= 1 && c.Lanes <= c.Prefetch, "Lanes", "%d out of range 1..Prefetch (%d)", c.Lanes, c.Prefetch)
	ck.Require(c.BatchSize >= 1 && c.BatchSize <= maxBatchSize, "BatchSize", "%d out of range 1..%d", c.BatchSize, maxBatchSize)
	ck.Require(c.BatchTime > 0, "BatchTime", "%v is not positive", c.BatchTime)
	ck.Require(c.Heartbeat >= time.Second, "Heartbeat", "%v is below 1s", c.Heartbeat)
	ck.Require(c.AMQPConfig.Heartbeat == 0, "AMQPConfig.Heartbeat", "%v: leave it zero and set Heartbeat", c.AMQPConfig.Heartbeat)
	ck.Require(c.LeaseTTL >= 300*time.Millisecond, "LeaseTTL", "%v is below 300ms", c.LeaseTTL)
	ck.Require(c.RetryPoll > 0, "RetryPoll", "%v is not positive", c.RetryPoll)
	ck.Require(c.RetentionAge >= 0, "RetentionAge", "%v is negative", c.RetentionAge)
	ck.Require(c.RetentionAge == 0 || c.RetentionInterval > 0, "RetentionInterval",
		"%v must be positive when RetentionAge is set", c.RetentionInterval)
	return ck.Err()
}

// validateConsumer is Validate plus what a Consumer needs beyond a Store.
func (c Config) validateConsumer() error {
	ck := confcheck.New("inbox")
	ck.Require(c.Exchange != "", "Exchange", "is empty; the source exchange is required")
	ck.Require(len(c.Bindings) > 0, "Bindings", "is empty; at least one routing key is required")
	return errors.Join(c.Validate(), ck.Err())
}

// amqpDialTimeout bounds an AMQP dial and its handshake.
const amqpDialTimeout = 5 * time.Second

// amqpConfig returns the amqp.Config of a connection named name:
// AMQPConfig with Heartbeat, a connection_name unless it has one, and
// for a nil Dial one bounded by timeout; a Dial given gets the same bound
// on the handshake after it (amqp091 clears the deadline once it is done).
func (c Config) amqpConfig(name string, timeout time.Duration) amqp.Config {
	ac := c.AMQPConfig
	ac.Heartbeat = c.Heartbeat
	props := amqp.Table{"connection_name": name}
	for k, v := range c.AMQPConfig.Properties {
		props[k] = v
	}
	ac.Properties = props
	user := c.AMQPConfig.Dial
	if user == nil {
		ac.Dial = amqp.DefaultDial(timeout)
		return ac
	}
	ac.Dial = func(network, addr string) (net.Conn, error) {
		conn, err := user(network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return conn, nil
	}
	return ac
}

// backoff returns the wait after the attempts-th failed attempt.
func (c Config) backoff(attempts int, jitter float64) time.Duration {
	d := c.RetryMin
	for i := 1; i < attempts && d < c.RetryMax; i++ {
		d *= 2
	}
	d = min(d, c.RetryMax)
	// jitter in [0,1): spread retries of many keys over [d/2, d).
	return d/2 + time.Duration(float64(d/2)*jitter)
}
