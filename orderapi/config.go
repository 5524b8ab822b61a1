package orderapi

import (
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ordo-relay/ordo/outbox"
)

// Config configures a Server. Start from DefaultConfig; New calls Validate.
type Config struct {
	// Exchange is the RabbitMQ exchange the order events are addressed to.
	// Empty means the default exchange. At most outbox.MaxNameBytes bytes.
	// Default "bookstore.ordering".
	Exchange string

	// MaxBodyBytes is the largest request body accepted; a larger one is
	// answered 413. Default 1 MiB.
	MaxBodyBytes int64

	// MaxItems is the most items one order may hold; more is answered 400.
	// Default 1000.
	MaxItems int

	// IdempotencyKeyTTL is how long an Idempotency-Key of POST /orders is
	// kept: a retry within it gets the first order back. After it the key
	// may be used for a new order, and the cleanup (RunKeyExpiry) deletes
	// it. Default 24h; at least one minute.
	IdempotencyKeyTTL time.Duration

	// KeyExpiryInterval is how often RunKeyExpiry deletes expired keys.
	// Default one minute.
	KeyExpiryInterval time.Duration

	// TracerProvider, when set, gives every request a server span, and
	// the events a request enqueues carry its context (traceparent and
	// tracestate headers). Nil, the default, turns tracing off; a valid
	// traceparent the client sent is still copied into the events.
	TracerProvider trace.TracerProvider
}

// DefaultExchange is the exchange order events go to unless configured
// otherwise.
const DefaultExchange = "bookstore.ordering"

// DefaultConfig returns the configuration the orderapi binary starts from.
func DefaultConfig() Config {
	return Config{
		Exchange:     DefaultExchange,
		MaxBodyBytes: 1 << 20,
		MaxItems:     1000,

		IdempotencyKeyTTL: 24 * time.Hour,
		KeyExpiryInterval: time.Minute,
	}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case len(c.Exchange) > outbox.MaxNameBytes:
		return fmt.Errorf("orderapi config: Exchange is %d bytes long, the limit is %d", len(c.Exchange), outbox.MaxNameBytes)
	case strings.IndexByte(c.Exchange, 0) >= 0:
		return fmt.Errorf("orderapi config: Exchange contains a NUL byte")
	case c.MaxBodyBytes < 1024:
		return fmt.Errorf("orderapi config: MaxBodyBytes is %d, it must be at least 1024", c.MaxBodyBytes)
	case c.MaxItems < 1 || c.MaxItems > 100000:
		return fmt.Errorf("orderapi config: MaxItems is %d, it must be between 1 and 100000", c.MaxItems)
	case c.IdempotencyKeyTTL < time.Minute:
		return fmt.Errorf("orderapi config: IdempotencyKeyTTL is %v, it must be at least 1m", c.IdempotencyKeyTTL)
	case c.KeyExpiryInterval <= 0:
		return fmt.Errorf("orderapi config: KeyExpiryInterval is %v, it must be positive", c.KeyExpiryInterval)
	}
	return nil
}
