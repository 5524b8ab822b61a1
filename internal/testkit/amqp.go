package testkit

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// NewExchange declares a durable topic exchange with a name unique to tb
// and deletes it when tb ends.
func NewExchange(tb testing.TB) string {
	tb.Helper()
	RequireRabbitMQ(tb)
	name := UniqueName(tb, "ex")
	WithChannel(tb, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(name, "topic", true, false, false, false, nil)
	})
	tb.Cleanup(func() {
		WithChannel(tb, func(ch *amqp.Channel) error { return ch.ExchangeDelete(name, false, false) })
	})
	return name
}

// WithChannel runs f on a fresh connection and channel to AMQPURL, failing
// tb if any step fails; the connection is closed before it returns.
func WithChannel(tb testing.TB, f func(*amqp.Channel) error) {
	tb.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		tb.Fatalf("connect to RabbitMQ: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("open channel: %v", err)
	}
	if err := f(ch); err != nil {
		tb.Fatalf("RabbitMQ: %v", err)
	}
}
