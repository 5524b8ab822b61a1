package rabbitmq

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ordo-relay/ordo/internal/testkit"
	"github.com/ordo-relay/ordo/relay"
	"github.com/ordo-relay/ordo/relay/relaytest"
)

// brokerHarness is the RabbitMQ publisher behind a TCP proxy, with an
// exchange of its own and a queue bound to "bound".
type brokerHarness struct {
	pub      *Publisher
	proxy    *testkit.Proxy
	exchange string
	queue    string // bound to exchange with "bound"
}

func newBrokerHarness(t *testing.T) relaytest.PublisherHarness {
	return newBroker(t, nil)
}

// newBroker is newBrokerHarness with the publisher's settings edited by
// edit (nil: as they are).
func newBroker(t *testing.T, edit func(*Config)) *brokerHarness {
	testkit.RequireRabbitMQ(t)
	ex := testkit.NewExchange(t)
	queue := testkit.UniqueName(t, "q")
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(queue, "bound", ex, false, nil)
	})
	t.Cleanup(func() {
		testkit.WithChannel(t, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(queue, false, false, false); return err })
	})
	host := strings.TrimSuffix(strings.TrimPrefix(testkit.AMQPURL(), "amqp://guest:guest@"), "/")
	proxy := testkit.NewProxy(t, host)
	cfg := Config{URL: proxy.URL(testkit.AMQPURL()), Window: 512, ReconnectMax: 100 * time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	pub, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	t.Cleanup(func() {
		proxy.Resume()
		proxy.DelayReplies(0)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &brokerHarness{pub: pub, proxy: proxy, exchange: ex, queue: queue}
}

func (h *brokerHarness) Publisher() relay.Publisher { return h.pub }

func (h *brokerHarness) msg(exchange, routingKey string) relay.Message {
	return relay.Message{Exchange: exchange, RoutingKey: routingKey, Type: "t", Payload: []byte(`{}`), OccurredAt: time.Now()}
}

func (h *brokerHarness) Routable() relay.Message   { return h.msg(h.exchange, "bound") }
func (h *brokerHarness) Unroutable() relay.Message { return h.msg(h.exchange, "nobody.listens") }
func (h *brokerHarness) Missing() relay.Message    { return h.msg(h.exchange+".missing", "bound") }
func (h *brokerHarness) Stall(testing.TB)          { h.proxy.Stall() }
func (h *brokerHarness) Cut(testing.TB)            { h.proxy.Cut() }
func (h *brokerHarness) Delay(testing.TB)          { h.proxy.DelayReplies(time.Hour) }
func (h *brokerHarness) Restore(testing.TB) {
	h.proxy.Resume()
	h.proxy.DelayReplies(0)
	h.proxy.Restore()
}

// BeforeWrite sets the publisher's test hook; Publish is called from the
// test's goroutine only, so no lock is needed.
func (h *brokerHarness) BeforeWrite(_ testing.TB, f func()) { h.pub.beforeWrite = f }

// Received takes every message from the harness's queue.
func (h *brokerHarness) Received(t testing.TB) []uuid.UUID {
	var ids []uuid.UUID
	testkit.WithChannel(t, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(h.queue, true)
			if err != nil || !ok {
				return err
			}
			id, err := uuid.Parse(d.MessageId)
			if err != nil {
				return fmt.Errorf("message id %q: %w", d.MessageId, err)
			}
			ids = append(ids, id)
		}
	})
	return ids
}

// TestConformance runs the relay.Publisher contract against RabbitMQ.
func TestConformance(t *testing.T) {
	relaytest.PublisherSuite(t, newBrokerHarness)
}
