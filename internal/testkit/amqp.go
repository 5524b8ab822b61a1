package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

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
	if err := UseChannel(context.Background(), AMQPURL(), f); err != nil {
		tb.Fatal(err)
	}
}

// UseChannel runs f on a fresh connection to amqpURL and a channel on it, and
// closes the connection before it returns. ctx bounds the dial only (at
// most 10 s): amqp091-go calls take no context. It is WithChannel for
// programs that are not tests (the bench).
func UseChannel(ctx context.Context, amqpURL string, f func(*amqp.Channel) error) error {
	d := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Dial: amqp.DefaultDial(d)})
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := f(ch); err != nil {
		return fmt.Errorf("RabbitMQ: %w", err)
	}
	return nil
}
