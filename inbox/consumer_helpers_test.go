package inbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/inbox"
	"github.com/ordo-relay/ordo/internal/testkit"
)

// testPartitions is P in the consumer tests: small, so binding is quick.
const testPartitions = 16

// consumerConfig returns a LocalConfig with a name, exchange and queues of
// tb's own, removed when tb ends.
func consumerConfig(tb testing.TB, shards int) inbox.Config {
	tb.Helper()
	cfg := inbox.LocalConfig(testkit.UniqueName(tb, "c"))
	cfg.AMQPURL = testkit.AMQPURL()
	cfg.Exchange = testkit.NewExchange(tb)
	cfg.Shards = shards
	cfg.Partitions = testPartitions
	cfg.Logger = testkit.Logger(tb, slog.LevelInfo)
	topo := inbox.TopologyOf(cfg)
	tb.Cleanup(func() { deleteTopology(tb, topo) })
	return cfg
}

func deleteTopology(tb testing.TB, t inbox.Topology) {
	testkit.WithChannel(tb, func(ch *amqp.Channel) error {
		var errs []error
		for i := range t.Shards {
			_, err := ch.QueueDelete(t.ShardQueue(i), false, false, false)
			errs = append(errs, err)
		}
		_, err := ch.QueueDelete(t.DeadQueue(), false, false, false)
		errs = append(errs, err,
			ch.ExchangeDelete(t.ShardsExchange(), false, false),
			ch.ExchangeDelete(t.UnroutableExchange(), false, false))
		return errors.Join(errs...)
	})
}

// running is a Consumer started by startConsumer.
type running struct {
	c      *inbox.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop cancels the consumer and waits for Run to return; calls after the
// first do nothing.
func (r *running) stop(tb testing.TB) {
	tb.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				tb.Errorf("consumer Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Fatal("consumer did not stop within 30s")
		}
	})
}

// startConsumer runs a consumer with instance name instance until tb ends.
func startConsumer(tb testing.TB, cfg inbox.Config, instance string, pool *pgxpool.Pool, h inbox.Handler) *running {
	tb.Helper()
	return startWith(tb, cfg, instance, func(cfg inbox.Config) (*inbox.Consumer, error) { return inbox.New(cfg, pool, h) })
}

// startWith runs the consumer that newConsumer makes of cfg, as
// startConsumer does.
func startWith(tb testing.TB, cfg inbox.Config, instance string, newConsumer func(inbox.Config) (*inbox.Consumer, error)) *running {
	tb.Helper()
	cfg.Instance = instance
	cfg.Logger = cfg.Logger.With("instance", instance)
	c, err := newConsumer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	select {
	case <-c.Ready():
	case err := <-r.done:
		tb.Fatalf("consumer %s: Run: %v", instance, err)
	case <-time.After(30 * time.Second):
		tb.Fatalf("consumer %s not ready within 30s", instance)
	}
	tb.Cleanup(func() { r.stop(tb) })
	return r
}

// publisher wraps testkit.OrdoPublisher with empty bodies.
type publisher struct{ p *testkit.OrdoPublisher }

func newPublisher(tb testing.TB, exchange string) *publisher {
	return &publisher{testkit.NewOrdoPublisher(tb, exchange, testPartitions)}
}

func (p *publisher) publish(key string, seq int64) { p.p.Publish(key, seq, "t", []byte(`{}`)) }

func (p *publisher) publishRaw(key string, h amqp.Table, id string) {
	p.p.PublishRaw(key, id, "t", h, []byte(`{}`))
}

// queueDepth returns the ready messages in queue.
func queueDepth(tb testing.TB, queue string) int {
	tb.Helper()
	var n int
	testkit.WithChannel(tb, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// waitHandled waits until every key in want was handled up to want[key].
func waitHandled(tb testing.TB, pool *pgxpool.Pool, want map[string]int64) {
	tb.Helper()
	testkit.WaitFor(tb, 30*time.Second, "all messages handled", func() bool {
		got := handledSeqs(tb, pool)
		for k, n := range want {
			if int64(len(got[k])) < n {
				return false
			}
		}
		return true
	})
}
