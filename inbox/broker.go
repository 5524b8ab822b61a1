package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// broker holds the instance's AMQP connection for the shard consumers
// (redialled on demand; dead letters have their own, see deadLetters).
// Safe for concurrent use.
type broker struct {
	cfg  Config
	topo Topology

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
	// downSince is when dialling first failed in the current outage (Unix
	// nanoseconds); zero while connected. Atomic, so that reachable, on the
	// lease loop's path, never waits for a dial in progress under mu.
	downSince atomic.Int64
}

func newBroker(cfg Config, topo Topology) *broker { return &broker{cfg: cfg, topo: topo} }

// errClosed is returned by connection after close.
var errClosed = errors.New("inbox broker connection closed")

// connection returns the open connection, dialling (and declaring the
// topology) if there is none.
func (b *broker) connection() (*amqp.Connection, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errClosed
	}
	if b.conn != nil && !b.conn.IsClosed() {
		return b.conn, nil
	}
	conn, err := b.dial()
	if err != nil {
		b.downSince.CompareAndSwap(0, time.Now().UnixNano())
		return nil, err
	}
	b.conn = conn
	b.downSince.Store(0)
	return conn, nil
}

// reachable reports false once the broker has been unreachable for longer
// than d: the instance then gives its shards to instances that reach it.
func (b *broker) reachable(d time.Duration) bool {
	since := b.downSince.Load()
	return since == 0 || time.Since(time.Unix(0, since)) <= d
}

// dial connects and declares the topology.
func (b *broker) dial() (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(b.cfg.AMQPURL, b.cfg.amqpConfig("ordo inbox "+b.cfg.Name+" "+b.cfg.Instance, amqpDialTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	// The declare waits for the broker's answers, under mu: bound it, or a
	// broker that accepts connections but stalls would hold mu forever.
	ctx, cancel := context.WithTimeout(context.Background(), deadTimeout)
	defer cancel()
	err = closeAtDeadline(ctx, conn, func() error {
		ch, err := conn.Channel()
		if err == nil {
			err = b.topo.Declare(ch)
			_ = ch.Close()
		}
		return err
	})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("declare topology: %w", err)
	}
	return conn, nil
}

func (b *broker) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.conn != nil {
		_ = b.conn.Close()
	}
}
